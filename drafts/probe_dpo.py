"""Issue 33 feasibility probe (not a lesson): does DPO on pairs the checker labels move the shipped chat model?

Pairs: training-part instructions of the tasks with signal (speaker, continue), 4 samples at temperature 1 each; a
prompt with a correct and an incorrect sample gives (chosen, rejected). Policy: a copy of the chat model whose LoRA
adapter keeps training; reference: the chat model, frozen. Reports held-out greedy exact match and held-out
preference accuracy (implicit reward margin > 0) before and after, with the mean margin and the KL estimate."""
import copy, importlib.util, json, sys, time
from pathlib import Path
import torch
from course_lib.finetuning import check_reply, chat_reply, load_shakespeare_chat, make_instructions
from course_lib.training import load_shakespeare

spec = importlib.util.spec_from_file_location("core", Path(__file__).with_name("15_alignment_core.py"))
core = importlib.util.module_from_spec(spec); spec.loader.exec_module(core)
torch.set_num_threads(1)
TASKS = ("speaker", "continue")
ref, tok = load_shakespeare_chat("cpu")
text = load_shakespeare(); cut = int(len(text) * 0.9)


def pairs_from(instructions, samples=4, seed=0):
    g, pairs = torch.Generator().manual_seed(seed), []
    for ex in instructions:
        if ex["task"] not in TASKS:
            continue
        replies = [chat_reply(ref, tok, ex["instruction"], max_new_tokens=48, temperature=1.0, generator=g) for _ in range(samples)]
        good = [r for r in replies if check_reply(ex, r)]
        bad = [r for r in replies if not check_reply(ex, r)]
        if good and bad:
            pairs.append((ex["instruction"], good[0], bad[0]))
    return pairs


def batch_logps(model, pairs):
    ctx = model.cfg.context_length
    ids_c, m_c = core.response_batch(tok, [(p, c) for p, c, _ in pairs], ctx)
    ids_r, m_r = core.response_batch(tok, [(p, r) for p, _, r in pairs], ctx)
    return core.sequence_logprobs(model, ids_c, m_c), core.sequence_logprobs(model, ids_r, m_r)


def exact(model, heldout):
    return {t: sum(check_reply(e, chat_reply(model, tok, e["instruction"], max_new_tokens=48)) for e in heldout if e["task"] == t)
            / sum(e["task"] == t for e in heldout) for t in TASKS}


t0 = time.time()
train_prompts = make_instructions(text[:cut], per_task=int(sys.argv[1]) if len(sys.argv) > 1 else 150, seed=11)
held_prompts = make_instructions(text[cut:], per_task=50, seed=1235, exclude=text[:cut])  # notebook 14's held-out set
train_pairs, held_pairs = pairs_from(train_prompts, seed=1), pairs_from(held_prompts, seed=2)
print(f"{len(train_pairs)} train pairs, {len(held_pairs)} held-out pairs, {time.time() - t0:.0f} s", flush=True)
policy = copy.deepcopy(ref).train()
for p in ref.parameters():
    p.requires_grad_(False)
params = [p for n, p in policy.named_parameters() if "lora_" in n]
for n, p in policy.named_parameters():
    p.requires_grad_("lora_" in n)
with torch.no_grad():
    ref_train = batch_logps(ref.eval(), train_pairs)
    ref_held = batch_logps(ref, held_pairs)


def held_stats(beta):
    with torch.no_grad():
        pc, pr = batch_logps(policy.eval(), held_pairs)
        margin = beta * ((pc - ref_held[0]) - (pr - ref_held[1]))
    return {"pref_acc": (margin > 0).float().mean().item(), "margin": margin.mean().item()}


before = {"exact": exact(ref, held_prompts)}
print("before", before, flush=True)
beta, lr, bs, epochs = float(sys.argv[3]), float(sys.argv[4]), 16, int(sys.argv[2])
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
g = torch.Generator().manual_seed(0)
for epoch in range(epochs):
    order = torch.randperm(len(train_pairs), generator=g).tolist()
    for i in range(0, len(order), bs):
        idx = order[i:i + bs]
        policy.train()
        pc, pr = batch_logps(policy, [train_pairs[j] for j in idx])
        loss, _, _ = core.dpo_loss(pc, pr, ref_train[0][idx], ref_train[1][idx], beta)
        opt.zero_grad(); loss.backward(); opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f} held {held_stats(beta)} {time.time() - t0:.0f} s", flush=True)
after = {"exact": exact(policy.eval(), held_prompts), **held_stats(beta)}
print("after", after, f"{time.time() - t0:.0f} s", flush=True)
