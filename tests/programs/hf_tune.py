"""The Hugging Face program of the tests, trained long enough to be tuned: ``stepwatch tune`` must tune the
Trainer's training loader (batches of 8), through accelerate's wrapper, and skip the steps its evaluations run in."""

import sys
import tempfile

from hf_train import make_trainer

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out:
        make_trainer(out, busy_s=0.002, max_steps=2000).train()
    sys.exit(3)  # never reached: stepwatch tune stops the training
