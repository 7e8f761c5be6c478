"""The embedded sample data (permissive licenses, see README.md), shipped as package data
(``biomed_lm.data``); see biomed_lm.resources."""
