"""course_lib now against course_lib at an earlier commit, in one process: a training step (forward, backward,
AdamW) and greedy KV-cache decoding at GPT-2 124M's shape, on identical weights, losses and tokens asserted equal,
interleaved rounds (then, now, then, now, ...), medians and the median of the per-round ratios now / then.
For a refactor that must not cost speed: both versions see the same machine load, so the ratio is the code.

    python benchmarks/versus_commit.py 7ddfc11              # about 6 minutes on 2 cores, 1 thread
    python benchmarks/versus_commit.py 7ddfc11 --quick      # smoke run, tiny model

The earlier package is taken from git (`git archive`), renamed to course_lib_then in a temporary folder and
imported beside the current one; the weights are copied parameter by parameter in order, so renamed layers
(ff.layers.0 -> ff.fc) do not matter as long as both versions build the same parameters in the same order.
"""

import dataclasses
import io
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from common import REPO_ROOT, Run, fmt_s, median, paired_ratio, parse_args, print_table, summarize, time_interleaved


def import_then(commit: str, folder: Path):
    """course_lib as it was at `commit`, importable as course_lib_then from `folder`: its model and generation."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "course_lib"], cwd=REPO_ROOT,
                             capture_output=True, check=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(folder, filter="data")
    package = folder / "course_lib_then"
    (folder / "course_lib").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(re.sub(r"\bcourse_lib\b", "course_lib_then", path.read_text(encoding="utf-8")),
                        encoding="utf-8")
    sys.path.insert(0, str(folder))
    import course_lib_then.config as config
    import course_lib_then.generation as generation
    import course_lib_then.model as model
    return config, model, generation


def tied_gpt(config, model, **fields):
    """A tied GPTModel of either version: tying is a GPTConfig field now, a GPTModel argument before."""
    if "tie_weights" in {f.name for f in dataclasses.fields(config.GPTConfig)}:
        return model.GPTModel(config.GPTConfig(**fields, tie_weights=True))
    return model.GPTModel(config.GPTConfig(**fields), tie_weights=True)


def commit_argument(parser) -> None:
    parser.add_argument("commit", help="the earlier commit to compare with, e.g. 7ddfc11")


def main():
    args = parse_args(__doc__, commit_argument)
    run = Run("versus_commit", args)
    import course_lib.config as config_now
    import course_lib.generation as generation_now
    import course_lib.model as model_now

    fields = (dict(vocab_size=500, context_length=128, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.0)
              if args.quick else dict(drop_rate=0.0))  # GPT-2 124M's shape otherwise
    batch, tokens, new_tokens = (2, 32, 20) if args.quick else (1, 256, 100)
    repeats = args.repeats or (2 if args.quick else 9)
    with tempfile.TemporaryDirectory() as folder:
        config_then, model_then, generation_then = import_then(args.commit, Path(folder))
        torch.manual_seed(123)
        now = tied_gpt(config_now, model_now, **fields)
        then = tied_gpt(config_then, model_then, **fields)
        then_params, now_params = list(then.parameters()), list(now.parameters())
        assert [p.shape for p in then_params] == [p.shape for p in now_params], "the versions build different models"
        with torch.no_grad():
            for p_then, p_now in zip(then_params, now_params):
                p_then.copy_(p_now)

        ids = torch.randint(0, now.cfg.vocab_size, (batch, tokens + 1), generator=torch.Generator().manual_seed(0))
        inputs, targets = ids[:, :-1], ids[:, 1:]
        optimizers = {m: torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (then, now)}

        def train_step(m):
            def step():
                loss = F.cross_entropy(m(inputs).flatten(0, 1), targets.flatten())
                optimizers[m].zero_grad(set_to_none=True)
                loss.backward()
                optimizers[m].step()
                return loss.item()
            return step

        steps = {"then": train_step(then.train()), "now": train_step(now.train())}
        first = {name: step() for name, step in steps.items()}
        assert abs(first["then"] - first["now"]) <= 1e-5 * abs(first["then"]), first
        train = time_interleaved(steps, repeats=repeats, warmup=0)

        prompt = torch.tensor([[464, 3290, 286, 262]]) % now.cfg.vocab_size  # (1, 4)
        decode = {"then": lambda: generation_then.generate(then, prompt, new_tokens),
                  "now": lambda: generation_now.generate(now, prompt, new_tokens)}
        assert torch.equal(decode["then"](), decode["now"]()), "the versions generate different tokens"
        generation = time_interleaved(decode, repeats=repeats, warmup=0)

    rows, results = [], {}
    for what, timings, unit in (("training step", train, f"batch {batch} x {tokens}"),
                                ("greedy decoding", generation, f"{new_tokens} new tokens")):
        times = timings.wall
        ratio = paired_ratio(times["now"], times["then"])
        per_round = [n / t for n, t in zip(times["now"], times["then"])]
        results[what] = {"then": summarize(times["then"], timings.cpu["then"]),
                         "now": summarize(times["now"], timings.cpu["now"]), "paired_ratio_now_over_then": ratio,
                         "per_round_ratios": per_round}
        rows.append([f"{what}, {unit}", fmt_s(median(times["then"])), fmt_s(median(times["now"])), f"{ratio:.3f}",
                     f"{min(per_round):.3f} - {max(per_round):.3f}"])
    print_table(["what", f"then ({args.commit})", "now", "now / then", "per-round range"], rows,
                title=f"course_lib now vs {args.commit}, {'tiny model' if args.quick else 'GPT-2 124M shape'}, "
                      f"{torch.get_num_threads()} thread(s), float32, {repeats} interleaved rounds; now / then = "
                      "median of the per-round time ratios (below 1: now is faster)")
    run.finish({"commit": args.commit, "fields": fields, "repeats": repeats, "first_loss": first, **results})


if __name__ == "__main__":
    main()
