"""The Lightning test program on 2 DDP ranks (Lightning starts the second one), with the stepwatch profiler."""

import sys

from lightning_train import train

from stepwatch.integrations.lightning import StepwatchProfiler

if __name__ == "__main__":
    train(StepwatchProfiler(out=sys.argv[1]), max_steps=6, devices=2)
