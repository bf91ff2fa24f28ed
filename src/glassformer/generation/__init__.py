"""Turning a trained model into text: token choice and decoding loops.

Both model kinds decode the same way: run the model, take the last position's logits,
adjust them (repetition penalty), pick a token (greedy, or sampled with temperature,
top-k, top-p), append it, stop on a stop token or the length limit. The translator can
also search: ``beam_size > 1`` keeps the K most likely partial translations at every
step. Every option lives in one ``GenerationConfig``; each function also takes the same
options as keywords, which override the config's fields.

    config.py    GenerationConfig: the options, checked once
    sampling.py  choose_next, usable_logits (the vocab limit, non-finite logits refused),
                 apply_repetition_penalty, and the GPT loop gpt_generate
    static.py    the GPT's static cache and one-token decode step (compilable)
    beam.py      beam_search over the translator's decoder
    seq2seq.py   the translator loop seq2seq_generate (greedy, sampled or beam)
"""

from glassformer.generation.beam import beam_search
from glassformer.generation.config import GenerationConfig
from glassformer.generation.sampling import (
    Streamer,
    apply_repetition_penalty,
    choose_next,
    gpt_generate,
)
from glassformer.generation.seq2seq import seq2seq_generate

__all__ = [
    "GenerationConfig",
    "Streamer",
    "apply_repetition_penalty",
    "beam_search",
    "choose_next",
    "gpt_generate",
    "seq2seq_generate",
]
