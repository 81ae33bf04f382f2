"""Issue 33 feasibility probe (not a lesson): does GRPO with the checker as reward raise the chat model's held-out
reward? Tasks with signal (speaker, continue); per step 4 training prompts x 8 samples at temperature 1; rewards
from check_reply; group advantages; one gradient step per batch (ratio 1, so no clipping acts), k3 KL to the frozen
chat model, loss_type "grpo"; LoRA of the chat adapter trains. Held-out: mean reward of 8 samples per prompt,
greedy exact match, and distinct answers per group (diversity), before and after.
    PYTHONPATH=. python drafts/probe_grpo.py STEPS BETA LR"""
import copy, importlib.util, sys, time
from pathlib import Path
import torch
from course_lib.finetuning import check_reply, chat_reply, load_shakespeare_chat, make_instructions
from course_lib.training import load_shakespeare

spec = importlib.util.spec_from_file_location("core", Path(__file__).with_name("15_alignment_core.py"))
core = importlib.util.module_from_spec(spec); spec.loader.exec_module(core)
torch.set_num_threads(1)
TASKS, GROUP = ("speaker", "continue"), 8
steps, beta, lr = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ref, tok = load_shakespeare_chat("cpu")
text = load_shakespeare(); cut = int(len(text) * 0.9)
train = [e for e in make_instructions(text[:cut], per_task=200, seed=21) if e["task"] in TASKS]
held = [e for e in make_instructions(text[cut:], per_task=15, seed=1235, exclude=text[:cut]) if e["task"] in TASKS]
policy = copy.deepcopy(ref)
for n, p in policy.named_parameters():
    p.requires_grad_("lora_" in n)
for p in ref.parameters():
    p.requires_grad_(False)


def sample(model, ex, g):
    return [chat_reply(model, tok, ex["instruction"], max_new_tokens=48, temperature=1.0, generator=g) for _ in range(GROUP)]


def held_stats(model):
    g, rewards, distinct = torch.Generator().manual_seed(99), [], []
    for ex in held:
        replies = sample(model.eval(), ex, g)
        rewards.append(sum(check_reply(ex, r) for r in replies) / GROUP)
        distinct.append(len(set(replies)))
    greedy = sum(check_reply(e, chat_reply(model, tok, e["instruction"], max_new_tokens=48)) for e in held) / len(held)
    return {"reward": round(sum(rewards) / len(rewards), 3), "greedy_exact": round(greedy, 3),
            "distinct_per_group": round(sum(distinct) / len(distinct), 2)}


t0 = time.time()
print("before", held_stats(policy), f"{time.time() - t0:.0f} s", flush=True)
opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
g, order, curve = torch.Generator().manual_seed(0), torch.randperm(len(train), generator=torch.Generator().manual_seed(1)).tolist(), []
for step in range(steps):
    batch = [train[order[(step * 4 + i) % len(train)]] for i in range(4)]
    pairs, rewards = [], []
    for ex in batch:
        for reply in sample(policy.eval(), ex, g):
            pairs.append((ex["instruction"], reply)); rewards.append(float(check_reply(ex, reply)))
    rewards = torch.tensor(rewards)
    ids, mask = core.response_batch(tok, pairs, policy.cfg.context_length)
    with torch.no_grad():
        ref_logps = core.token_logprobs(ref.eval(), ids, mask)
    policy.train()
    logps = core.token_logprobs(policy, ids, mask)
    loss = core.grpo_loss(logps, logps.detach(), ref_logps, core.group_advantages(rewards, GROUP), mask[:, 1:], beta, 0.2)
    opt.zero_grad(); loss.backward(); opt.step()
    curve.append(rewards.mean().item())
    if (step + 1) % 10 == 0:
        print(f"step {step + 1}: train reward (last 10 steps) {sum(curve[-10:]) / 10:.3f} {time.time() - t0:.0f} s", flush=True)
print("after", held_stats(policy), f"{time.time() - t0:.0f} s", flush=True)
