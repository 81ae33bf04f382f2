"""The checks of the exercises in notebooks/02_embeddings.ipynb."""

import inspect

import torch
from torch import Tensor, nn

from course_lib.config import GPTConfig
from course_lib.embeddings import GPTEmbedding, SinusoidalPositionalEmbedding

from .core import Checker, build, compare, isolated_rng, require_class, require_function


@isolated_rng
def check_sinusoidal_table(learner_impl) -> None:
    """Check `learner_impl(emb_dim, context_length)`, the sinusoidal position code of notebook 02.

    Must return a float tensor (context_length, emb_dim) whose row p, column j is sin(p * w_j) for even j and
    cos(p * w_j) for odd j, with w_j = 10000 ** (-2 * (j // 2) / emb_dim), for any emb_dim (odd too), like
    course_lib.embeddings.SinusoidalPositionalEmbedding(emb_dim, context_length)(context_length)."""
    ck = Checker("check_sinusoidal_table")
    require_function(ck, learner_impl, "my_sinusoidal_table(emb_dim, context_length)")

    def table(emb_dim, context_length, column_speed=lambda j, d: 10000.0 ** (-2 * (j // 2) / d), first="sin",
              start=0, layout="interleaved"):
        p = torch.arange(start, start + context_length, dtype=torch.float64).unsqueeze(1)  # (context_length, 1)
        j = torch.arange(emb_dim, dtype=torch.float64)
        angles = p * column_speed(j, emb_dim)  # (context_length, emb_dim)
        if layout == "blocks":  # sines of every speed first, then cosines
            half = (emb_dim + 1) // 2
            speeds = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / emb_dim)
            return torch.cat([torch.sin(p * speeds), torch.cos(p * speeds)[:, : emb_dim - half]], dim=1)
        even = (j % 2 == 0)
        sin, cos = torch.sin(angles), torch.cos(angles)
        return torch.where(even, sin, cos) if first == "sin" else torch.where(even, cos, sin)

    for emb_dim, context_length in ((8, 12), (16, 50), (9, 7)):
        expected = SinusoidalPositionalEmbedding(emb_dim, context_length)(context_length)
        crash_bug = ("an odd emb_dim has one more sine than cosine: fill the sines into columns 0::2 and the "
                     "cosines into 1::2 using only the first emb_dim // 2 angles") if emb_dim % 2 else None
        got = ck.call(f"my_sinusoidal_table({emb_dim}, {context_length})", learner_impl, emb_dim, context_length,
                      bug=crash_bug)
        variants = [
            ("the table is transposed: return it as (context_length, emb_dim), one row per position",
             lambda: table(emb_dim, context_length).T),
            ("sine and cosine are swapped: even columns hold the sine, odd columns the cosine",
             lambda: table(emb_dim, context_length, first="cos")),
            ("every column has its own speed: columns 2i and 2i + 1 share one speed, so the exponent uses "
             "2 * (j // 2), not j", lambda: table(emb_dim, context_length, column_speed=lambda j, d: 10000.0 ** (-j / d))),
            ("the exponent has lost its minus sign: the speeds must shrink from 1 towards 1/10000",
             lambda: table(emb_dim, context_length, column_speed=lambda j, d: 10000.0 ** (2 * (j // 2) / d))),
            ("positions start at 1: the first row is position 0 (sin 0 = 0, cos 0 = 1)",
             lambda: table(emb_dim, context_length, start=1)),
            ("the sines and cosines sit in two blocks: interleave them, sines in columns 0, 2, 4, ... and "
             "cosines in 1, 3, 5, ...", lambda: table(emb_dim, context_length, layout="blocks")),
        ]
        compare(ck, got, expected, variants, f"for emb_dim={emb_dim}, context_length={context_length}",
                "compare row 1 of your table with the formula by hand", atol=1e-5, rtol=1e-4)
    ck.done("Your table matches SinusoidalPositionalEmbedding, odd emb_dim included.")


def embedding_variants(ref: GPTEmbedding, ids: Tensor, start_pos: int = 0):
    num_tokens = ids.shape[1]
    positions = torch.arange(start_pos, start_pos + num_tokens)
    tok = ref.tok_emb(ids)
    return [
        ("the position embedding is never added: return tok_emb(token_ids) + pos_emb(positions)", lambda: tok),
        ("the token embedding is missing: add tok_emb(token_ids) to the position embedding",
         lambda: ref.pos_emb(positions).expand_as(tok)),
        ("pos_emb is looked up with the token ids; look it up with the positions "
         "torch.arange(num_tokens)", lambda: tok + ref.pos_emb(ids)),
        ("positions start at 1; the first token sits at position 0: torch.arange(num_tokens)",
         lambda: tok + ref.pos_emb(positions + 1)),
        ("start_pos is ignored: with start_pos the tokens sit at positions start_pos .. start_pos + tokens - 1",
         lambda: tok + ref.pos_emb(positions - start_pos)),
        ("the two embeddings are concatenated; add them instead, so the output keeps emb_dim features",
         lambda: torch.cat([tok, ref.pos_emb(positions).expand_as(tok)], dim=-1)),
    ]


@isolated_rng
def check_gpt_embedding(learner_impl) -> None:
    """Check `learner_impl`, GPT-2's input layer from notebook 02.

    learner_impl(cfg) takes a GPTConfig and holds `tok_emb` (nn.Embedding(vocab_size, emb_dim)), `pos_emb`
    (nn.Embedding(context_length, emb_dim)) and a dropout; forward(token_ids) maps integer ids
    (batch, tokens) to (batch, tokens, emb_dim). If forward also takes `start_pos`, that is checked too.
    Compared with course_lib.embeddings.GPTEmbedding."""
    ck = Checker("check_gpt_embedding")
    require_class(ck, learner_impl, "MyGPTEmbedding(cfg)")
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=6, n_heads=2, n_layers=1, drop_rate=0.0)
    mine = build(ck, learner_impl, cfg, signature="MyGPTEmbedding(cfg) with a GPTConfig")
    ref = GPTEmbedding(cfg).double().eval()
    for name, rows, role in (("tok_emb", cfg.vocab_size, "token id"), ("pos_emb", cfg.context_length, "position")):
        layer = getattr(mine, name, None)
        if not isinstance(layer, nn.Embedding):
            ck.fail(f"your module has no nn.Embedding called {name}",
                    f"name the layers as in the lesson: self.{name} = nn.Embedding(...)")
        if tuple(layer.weight.shape) != (rows, cfg.emb_dim):
            wrong = ("vocab_size" if layer.weight.shape[0] == cfg.vocab_size else
                     "context_length" if layer.weight.shape[0] == cfg.context_length else str(layer.weight.shape[0]))
            ck.fail(f"{name} has shape {tuple(layer.weight.shape)}, expected ({rows}, {cfg.emb_dim})",
                    f"{name} needs one row per {role}: nn.Embedding("
                    f"{'cfg.vocab_size' if rows == cfg.vocab_size else 'cfg.context_length'}, cfg.emb_dim), "
                    f"not {wrong} rows")
    ck.ok()
    mine = mine.double().eval()
    with torch.no_grad():
        mine.tok_emb.weight.copy_(ref.tok_emb.weight)
        mine.pos_emb.weight.copy_(ref.pos_emb.weight)
        takes_start = "start_pos" in inspect.signature(mine.forward).parameters
        for ids, what in ((torch.randint(0, cfg.context_length, (2, 5)), "token ids (2, 5)"),
                          (torch.randint(0, cfg.vocab_size, (3, cfg.context_length)),
                           f"a full context of {cfg.context_length} tokens"),
                          (torch.tensor([[7]]), "one sequence of one token")):
            got = ck.call(f"forward on {what}", mine, ids)
            compare(ck, got, ref(ids), embedding_variants(ref, ids), f"for {what}",
                    "print tok_emb(ids), pos_emb(positions) and your output for a (1, 2) input")
        if takes_start:
            ids = torch.randint(0, cfg.vocab_size, (2, 3))
            got = ck.call("forward(token_ids, start_pos=4)", mine, ids, start_pos=4)
            compare(ck, got, ref(ids, start_pos=4), embedding_variants(ref, ids, 4),
                    "for 3 tokens with start_pos=4", "positions are start_pos, start_pos + 1, ...")
        # dropout: active in training mode only
        mine_dropout = build(ck, learner_impl, GPTConfig(vocab_size=50, context_length=8, emb_dim=6, n_heads=2,
                                                         n_layers=1, drop_rate=0.5), signature="MyGPTEmbedding(cfg)")
        ids = torch.randint(0, cfg.vocab_size, (4, 8))
        mine_dropout.train()
        zeros = (ck.call("forward in training mode", mine_dropout, ids) == 0).double().mean().item()
        if 0.03 < zeros < 0.35:
            ck.fail(f"with drop_rate 0.5 in training mode only {zeros:.0%} of your outputs are zero",
                    f"the dropout rate is fixed (about {zeros:.1f}) instead of cfg.drop_rate: "
                    "self.drop_emb = nn.Dropout(cfg.drop_rate)")
        if zeros < 0.2:
            ck.fail(f"with drop_rate 0.5 in training mode only {zeros:.0%} of your outputs are zero",
                    "no dropout after the sum: self.drop_emb = nn.Dropout(cfg.drop_rate), applied to "
                    "tok_emb(...) + pos_emb(...)")
        mine_dropout.eval()
        if not torch.equal(mine_dropout(ids), mine_dropout(ids)):
            ck.fail("in eval mode two calls on the same ids give different outputs",
                    "dropout still runs in eval mode: use nn.Dropout (which follows .eval()), or pass "
                    "training=self.training to F.dropout")
        ck.ok()
    ck.done("Your GPTEmbedding matches course_lib's: token plus position embeddings, then dropout.")
