"""The Hugging Face test program as one rank of a torchrun job, with stepwatch attached."""

import sys

from hf_train import make_trainer

from stepwatch.integrations.transformers import attach

if __name__ == "__main__":
    trainer = make_trainer(sys.argv[1], max_steps=6)
    attach(trainer, out=sys.argv[2])
    trainer.train()
