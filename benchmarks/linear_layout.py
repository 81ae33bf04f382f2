"""Why the course's cached generation trails Hugging Face's: the layout of the weight matrices, not the code
around them. nn.Linear stores a weight as (out_features, in_features) and multiplies by its transpose; GPT-2's
Conv1D (Hugging Face) stores (in_features, out_features). With one token per step every weight is read once per
token, and the CPU's matrix-vector kernels read the two layouts at different speeds. This script times greedy
generation three ways on the 124M shape, same weights, outputs asserted identical:

  course            course_lib's GPTModel as it is (nn.Linear everywhere)
  course, (in,out)  the same model, each Linear inside the blocks replaced by torch.addmm with a transposed copy
                    of its weight (HF's layout); an experiment only, the course keeps nn.Linear for clarity
  hf                transformers' GPT2LMHeadModel.generate

    python benchmarks/linear_layout.py            # about two minutes on 2 cores
    python benchmarks/linear_layout.py --quick    # smoke run
"""

import copy

import torch
from torch import nn

from common import Run, build_pair, fmt_s, hf_greedy, median, parse_args, print_table, summarize, time_interleaved
from course_lib.generation import generate
from course_lib.tokenization import gpt2_tokenizer
from generation import PROMPT


class InOutLinear(nn.Module):
    """nn.Linear's function with the weight stored (in_features, out_features), computed as Conv1D does."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().t().contiguous())  # (in, out)
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)  # (batch * tokens, out)
        return out.view(*x.shape[:-1], out.shape[-1])


def with_in_out_layout(model: nn.Module) -> nn.Module:
    """A copy of the course model whose block Linears (q, k, v, out_proj, both feed-forward layers) use
    InOutLinear; the output head stays nn.Linear, as HF's lm_head is one too."""
    model = copy.deepcopy(model)
    for block in model.trf_blocks:
        for name in ("W_query", "W_key", "W_value", "out_proj"):
            setattr(block.att, name, InOutLinear(getattr(block.att, name)))
        for name in ("fc", "proj"):
            setattr(block.ff, name, InOutLinear(getattr(block.ff, name)))
    return model


def main():
    args = parse_args(__doc__)
    run = Run("linear_layout", args)
    shape, new_tokens = ((64, 2, 4, 256), 20) if args.quick else ((768, 12, 12, 1024), 100)
    repeats = args.repeats or (2 if args.quick else 5)
    course, hf = build_pair(*shape)
    in_out = with_in_out_layout(course)
    prompt = torch.tensor([gpt2_tokenizer().encode(PROMPT)])  # (1, prompt tokens)
    fns = {
        "course": lambda: generate(course, prompt, max_new_tokens=new_tokens),
        "course, (in,out) layout": lambda: generate(in_out, prompt, max_new_tokens=new_tokens),
        "hf": hf_greedy(hf, prompt, new_tokens),
    }
    outputs = {name: fn() for name, fn in fns.items()}
    assert all(torch.equal(out, outputs["hf"]) for out in outputs.values()), "the three must generate the same tokens"
    timings = time_interleaved(fns, repeats=repeats, warmup=0)
    per_token = {name: median(t) / new_tokens for name, t in timings.wall.items()}
    rows = [[name, fmt_s(seconds), f"{seconds / per_token['hf']:.3f}"] for name, seconds in per_token.items()]
    print_table(["variant", "per token", "time / HF"], rows,
                title=f"greedy generation with cache, emb {shape[0]} / {shape[1]} layers, {new_tokens} new tokens, "
                      f"{torch.get_num_threads()} threads, medians of {repeats} interleaved runs; tokens identical")
    run.finish({"shape": shape, "new_tokens": new_tokens, "repeats": repeats, "seconds_per_token": per_token,
                "times": {name: summarize(timings.wall[name], timings.cpu[name]) for name in fns}})


if __name__ == "__main__":
    main()
