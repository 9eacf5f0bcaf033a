"""A tiny LightningModule on synthetic data, for the Lightning integration's tests (never imports stepwatch)."""

import lightning as L
import torch
from busy import BUSY_NS, busy_wait
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __init__(self, size, busy_s):
        self.size, self.busy_s = size, busy_s

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if self.busy_s:
            busy_wait(self.busy_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(8, generator=generator), index % 2


class Model(L.LightningModule):
    def __init__(self, manual=False, fail_at=None):
        super().__init__()
        self.fail_at = fail_at  # a training_step that raises at this batch
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.head = nn.Linear(2, 2)
        self.criterion = nn.CrossEntropyLoss()
        self.automatic_optimization = not manual
        self.last_loss = None

    def forward(self, x):
        return self.head(self.net(x))

    def training_step(self, batch, index):
        if index == self.fail_at:
            raise RuntimeError("diverged")
        x, y = batch
        loss = self.criterion(self(x), y)
        self.log("train_loss", loss)
        self.last_loss = loss.detach()
        if self.automatic_optimization:
            return loss
        first, second = self.optimizers()  # two optimizers, stepped by hand
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        return None

    def validation_step(self, batch, index):
        x, y = batch
        self.log("val_loss", self.criterion(self(x), y))

    def test_step(self, batch, index):
        x, y = batch
        self.log("test_loss", self.criterion(self(x), y))

    def predict_step(self, batch, index):
        x, _ = batch
        return self(x).argmax(dim=1)

    def configure_optimizers(self):
        if self.automatic_optimization:
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.SGD(self.head.parameters(), lr=0.1)


def train(profiler=None, workers=0, manual=False, busy_s=0.0, max_steps=20, accumulate=2, devices=1, fail_at=None):
    """Trains for ``max_steps`` optimizer steps (16 batches an epoch), validating every 10 batches."""
    L.seed_everything(0, verbose=False)
    BUSY_NS[0] = 0
    trainer = L.Trainer(
        max_steps=max_steps,
        val_check_interval=10 // devices,
        accumulate_grad_batches=1 if manual else accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        profiler=profiler,
    )
    model = Model(manual, fail_at)
    train_loader = DataLoader(Data(128, busy_s), batch_size=8, num_workers=workers)
    val_loader = DataLoader(Data(32, 0.0), batch_size=16, num_workers=workers)
    trainer.fit(model, train_loader, val_loader)
    return model, trainer


def evaluate(kind, profiler=None, workers=0, busy_s=0.0):
    """``trainer.test`` or ``trainer.predict`` (``kind``) of an untrained model over 48 samples in batches of 8."""
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        profiler=profiler,
    )
    model = Model()
    loader = DataLoader(Data(48, busy_s), batch_size=8, num_workers=workers)
    result = getattr(trainer, kind)(model, loader)
    return model, result
