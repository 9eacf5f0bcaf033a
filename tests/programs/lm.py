"""A tiny language model trained on batches sliced from one tensor, without a DataLoader, as in nanoGPT-like
examples; it never imports stepwatch. Every 10 steps it estimates the loss under no_grad."""

import sys

import torch
from torch import nn

ITERATIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 40


class Bigram(nn.Module):
    def __init__(self, vocabulary):
        super().__init__()
        self.table = nn.Embedding(vocabulary, vocabulary)

    def forward(self, tokens, targets=None):
        logits = self.table(tokens)
        if targets is None:
            return logits, None
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_batch(data, generator):
    starts = torch.randint(len(data) - 9, (8,), generator=generator)
    x = torch.stack([data[i : i + 8] for i in starts])
    y = torch.stack([data[i + 1 : i + 9] for i in starts])
    return x, y


def main():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    data = torch.randint(0, 32, (2000,), generator=generator)
    model = Bigram(32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for iteration in range(ITERATIONS):
        if iteration % 10 == 0:
            with torch.no_grad():
                losses = [model(*get_batch(data, generator))[1].item() for _ in range(3)]
            print(f"step {iteration}: estimated loss {sum(losses) / 3:.4f}")
        x, y = get_batch(data, generator)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item()!r}")


if __name__ == "__main__":
    main()
