"""The toolkit's YAML configs, shipped as package data (``biomed_lm.configs``); see biomed_lm.resources."""
