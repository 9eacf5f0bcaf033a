"""A tiny BERT trained by the Hugging Face Trainer on synthetic data (no download), for the integration's tests."""

import torch
from busy import BUSY_NS, busy_wait
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed


class Synthetic(Dataset):
    def __init__(self, size, busy_s=0.0):
        self.size, self.busy_s = size, busy_s

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if self.busy_s:
            busy_wait(self.busy_s)
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(1, 100, (16,), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones(16, dtype=torch.long), "labels": int(ids[0] % 2)}


def make_trainer(output_dir, busy_s=0.0, max_steps=12, callbacks=None, num_workers=0):
    set_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=str(output_dir),
        report_to=[],
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        gradient_accumulation_steps=2,
        max_steps=max_steps,
        eval_strategy="steps",
        eval_steps=5,
        logging_steps=2,
        save_strategy="no",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=num_workers,
        disable_tqdm=True,
    )
    BUSY_NS[0] = 0
    return Trainer(
        model=model,
        args=args,
        train_dataset=Synthetic(256, busy_s),
        eval_dataset=Synthetic(32),
        callbacks=callbacks,
    )
