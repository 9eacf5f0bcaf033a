"""A training loop shaped like nanoGPT's ``train.py``, written for the tests: batches sliced from one tensor (no
DataLoader), AdamW, ``estimate_loss()`` under ``@torch.no_grad()`` with ``model.eval()`` every
``EVAL_INTERVAL`` iterations, and ``zero_grad`` after each optimizer step. The forward busy-waits
``FORWARD_S`` (the known workload); the program writes its own clock's figures to ``argv[1]``."""

import json
import sys
import time

import torch
from torch import nn

sys.path.insert(0, __import__("os").path.dirname(__file__))
from busy import busy_wait

FORWARD_S = 0.002
EVAL_ITERS, EVAL_INTERVAL, MAX_ITERS = 5, 10, 40
BLOCK, BATCH = 16, 4

torch.manual_seed(0)
torch.set_num_threads(1)
data = torch.randint(0, 32, (4096,))


def get_batch():
    ix = torch.randint(len(data) - BLOCK, (BATCH,))
    x = torch.stack([data[i : i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
    return x, y


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(32, 32)
        self.head = nn.Linear(32, 32)

    def forward(self, idx, targets):
        busy_wait(FORWARD_S)
        logits = self.head(self.embedding(idx))
        return logits, nn.functional.cross_entropy(logits.view(-1, 32), targets.view(-1))


model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(EVAL_ITERS)
        for k in range(EVAL_ITERS):
            x, y = get_batch()
            _, loss = model(x, y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


iterations = []  # per iteration: its time by this program's clock, whether it evaluated and how long that took
x, y = get_batch()
iter_num = 0
started = time.perf_counter()
while True:
    evaluated = iter_num % EVAL_INTERVAL == 0
    evaluation_s = 0.0
    if evaluated:
        before = time.perf_counter()
        estimate_loss()
        evaluation_s = time.perf_counter() - before
    _, loss = model(x, y)
    x, y = get_batch()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    now = time.perf_counter()
    iterations.append({"s": now - started, "evaluated": evaluated, "evaluation_s": evaluation_s})
    started = now
    iter_num += 1
    if iter_num > MAX_ITERS:
        break

with open(sys.argv[1], "w") as file:
    own = {"iterations": iterations, "optimizer_steps": iter_num, "eval_forwards": 2 * EVAL_ITERS}
    json.dump({**own, "forward_s": FORWARD_S}, file)
