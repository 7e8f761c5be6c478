"""Sentence splitting on biomedical text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.tokenization.sentences import split_sentences


def test_biomedical_abbreviations_and_decimals():
    assert split_sentences("Smith et al. reported a 2.5 mg dose. The drug was given i.v. to all patients.") == [
        "Smith et al. reported a 2.5 mg dose.", "The drug was given i.v. to all patients."]
    assert split_sentences("Patients received approx. 3.5 mg/kg (i.v.) daily. Outcomes improved (p < 0.05). "
                           "Fig. 2 shows results.") == [
        "Patients received approx. 3.5 mg/kg (i.v.) daily.", "Outcomes improved (p < 0.05).",
        "Fig. 2 shows results."]


def test_titles_and_genus_initials_do_not_end_sentences():
    assert split_sentences("Dr. Jones et al. [12] disagreed. Growth of S. aureus was inhibited. "
                           "CONCLUSIONS: More work is needed.") == [
        "Dr. Jones et al. [12] disagreed.", "Growth of S. aureus was inhibited.", "CONCLUSIONS: More work is needed."]


def test_empty_and_single():
    assert split_sentences("   ") == []
    assert split_sentences("No period at the end") == ["No period at the end"]


TOKENS = st.sampled_from(["Dr.", "et", "al.", "2.5", "mg", "i.v.", "Fig.", "E.", "coli", "cells", "grew", ".",
                          "The", "insulin", "(p", "<", "0.05).", "?", "IL-6", "approx.", "vs.", "CONCLUSIONS:"])


@settings(max_examples=200, deadline=None)
@given(st.lists(TOKENS, min_size=1, max_size=60))
def test_splitting_loses_and_reorders_nothing(tokens):
    text = " ".join(tokens)
    sentences = split_sentences(text)
    assert "".join("".join(sentences).split()) == "".join(text.split())
    assert all(s == s.strip() and s for s in sentences)


def test_all_capitals_are_other_words_and_al_ca_continue_only_mid_sentence():
    """QA: matched in any case, "MS." (multiple sclerosis, mass spectrometry) and "Ca." (calcium) rejoined
    sentences Bling Fire had split, and "et al." rejoined "... et al. Our results ..."."""
    assert split_sentences("Samples were run by MS. Furthermore, the dose rose.") == [
        "Samples were run by MS.", "Furthermore, the dose rose."]
    assert split_sentences("Serum Ca. Levels were normal.") == ["Serum Ca.", "Levels were normal."]
    assert split_sentences("As shown by Smith et al. Our results extend it.") == [
        "As shown by Smith et al.", "Our results extend it."]
    assert split_sentences("Dr. Jones and Ms. Lee agreed. See Fig. 2 and fig. 3.") == [
        "Dr. Jones and Ms. Lee agreed.", "See Fig. 2 and fig. 3."]


def test_a_line_break_always_ends_a_sentence():
    """The corpus puts a structured abstract's sections on lines of their own; a section's last sentence need
    not end in a period (QA: "... undergoing IVF. None. Incidence ..." came out as one sentence)."""
    assert split_sentences("Women undergoing IVF\nNone.\nIncidence of aneuploidy rose") == [
        "Women undergoing IVF", "None.", "Incidence of aneuploidy rose"]
