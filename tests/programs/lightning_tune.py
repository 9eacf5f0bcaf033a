"""The Lightning program of the tests, trained long enough to be tuned: ``stepwatch tune`` must tune its training
loader (batches of 8), not the validation loader its sanity check reads first (batches of 16)."""

from lightning_train import train

if __name__ == "__main__":
    train(max_steps=2000, busy_s=0.002)
