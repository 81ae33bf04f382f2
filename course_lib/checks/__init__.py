"""Not a lesson: the exercise checks, course infrastructure.

Each check_* function grades a learner's code against the lesson modules of course_lib, names the most likely
mistake when the code is off, and prints one line when all is well. There is one file per lesson module, named
after it (tokenization.py checks the exercises of notebook 01, ...); core.py holds what they share.
"""

from .alignment import check_dpo_loss, check_group_advantages, check_grpo_loss
from .attention import check_causal_attention, check_multihead_attention
from .block import check_transformer_block
from .core import CheckFailed, answer_size
from .decoding import check_beam_search, check_beam_step, check_min_p, check_no_repeat_ngram, check_repetition_penalty
from .embeddings import check_gpt_embedding, check_sinusoidal_table
from .feedforward import check_feedforward, check_gelu
from .finetuning import check_lora_linear
from .generation import check_greedy_decoding, check_temperature, check_top_k, check_top_p
from .interpretability import check_induction_score, check_logit_lens
from .long_context import check_ring_cache, check_window_mask, check_yarn_ramp
from .model import check_gpt_model
from .modern import check_grouped_query_attention, check_rms_norm, check_rotary_attention
from .normalization import check_layernorm
from .tokenization import check_bpe_encode, check_count_pairs, check_merge_pair
from .training import check_next_token_loss, check_perplexity

__all__ = [
    "CheckFailed", "answer_size",
    "check_merge_pair", "check_count_pairs", "check_bpe_encode",  # 01 tokenization
    "check_sinusoidal_table", "check_gpt_embedding",  # 02 embeddings
    "check_layernorm",  # 03 layernorm
    "check_gelu", "check_feedforward",  # 04 gelu, feedforward
    "check_causal_attention", "check_multihead_attention",  # 05 attention
    "check_transformer_block",  # 06 transformer block
    "check_gpt_model",  # 07 gpt model
    "check_temperature", "check_top_k", "check_top_p", "check_greedy_decoding",  # 08 generation
    "check_next_token_loss", "check_perplexity",  # 09 training
    "check_repetition_penalty", "check_beam_step", "check_no_repeat_ngram", "check_min_p",  # 11
    "check_beam_search",  # 11 decoding
    "check_induction_score", "check_logit_lens",  # 12 interpretability
    "check_lora_linear",  # 14 finetuning
    "check_dpo_loss", "check_group_advantages", "check_grpo_loss",  # 15 alignment
    "check_rms_norm", "check_rotary_attention", "check_grouped_query_attention",  # 16 modern llm
    "check_window_mask", "check_ring_cache", "check_yarn_ramp",  # 17 long context
]
