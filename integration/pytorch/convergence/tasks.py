"""The convergence suite's tasks: data, model, optimizer and evaluation.

Every task is small enough for 4 single-threaded ranks on a 2-core machine
and needs nothing from the network:

  lm     character-level GRU language model on Python's own standard-library
         sources (found on every machine that runs this suite); metric:
         next-character accuracy, loss in nats per character. Adam, as
         language models are usually trained.
  cnn    small CNN on scikit-learn's bundled digits, upsampled to 16x16 and
         made harder by random shifts, contrast and pixel noise (generated
         from the seed, so every run sees the same images); metric: test
         accuracy. SGD with momentum 0.9.
  mixed  an MLP whose DDP buckets mix large and small tensors: DDP's first
         bucket (1 MB) holds a 262k-element matrix together with layer
         norms, biases and 64x64 layers of a few thousand elements; the next
         holds a 33k matrix with its norm; the last (0.1 MB cap) only small
         layers, below COMPCOLL_MIN_ELEMS, so it stays dense. Trained as a
         student of a fixed random teacher; metric: accuracy on held-out
         teacher labels. SGD with momentum 0.9.

A task object gives: batch_at(rank, world, step) -> (inputs, targets), the
same for every algorithm; model(); optimizer(params, kind) (kind "default":
the task's own; "sgd", "adam": run.py --optimizer); loss(output, target);
evaluate(model) -> (loss, metric) on held-out data; ddp_kwargs.
"""
import glob
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def make_optimizer(params, kind, sgd_lr, adam_lr):
    """SGD with momentum 0.9 (sgd) or without (sgd0), or Adam, at the task's
    learning rate for each (run.py --optimizer: to tell the optimizer's part
    from the algorithm's)."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=sgd_lr, momentum=0.9)
    if kind == "sgd0":  # for COMPCOLL_MOMENTUM (DGC's momentum correction replaces it)
        return torch.optim.SGD(params, lr=sgd_lr, momentum=0.0)
    if kind == "adam":
        return torch.optim.Adam(params, lr=adam_lr)
    raise ValueError(f"unknown optimizer {kind!r} (sgd, sgd0, adam)")


class LanguageModel:
    name = "lm"
    metric = "next-char accuracy"
    ddp_kwargs = {}

    def __init__(self, seed, chars=600_000, seq=64, batch=16):
        stdlib = os.path.dirname(os.__file__)
        files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
        if not files:
            raise RuntimeError(f"no Python sources under {stdlib} to train the language model on")
        parts, total = [], 0
        for path in files:  # sorted: the same text on every rank and every run
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            parts.append(text)
            total += len(text)
            if total >= chars:
                break
        text = "".join(parts)[:chars]
        # Printable ASCII plus newline; everything else becomes one symbol.
        codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8).astype(np.int64)
        codes = np.where((codes >= 32) & (codes < 127), codes - 31, np.where(codes == 10, 0, 96))
        data = torch.from_numpy(codes)
        split = int(len(data) * 0.9)
        self.train, self.val = data[:split], data[split:]
        self.vocab, self.seq, self.batch, self.seed = 97, seq, batch, seed
        gen = torch.Generator().manual_seed(seed + 1000)
        starts = torch.randint(0, len(self.val) - seq - 1, (256,), generator=gen)
        self.val_x = torch.stack([self.val[s:s + seq] for s in starts])
        self.val_y = torch.stack([self.val[s + 1:s + seq + 1] for s in starts])

    def batch_at(self, rank, world, step):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 131 + rank)
        starts = torch.randint(0, len(self.train) - self.seq - 1, (self.batch,), generator=gen)
        x = torch.stack([self.train[s:s + self.seq] for s in starts])
        y = torch.stack([self.train[s + 1:s + self.seq + 1] for s in starts])
        return x, y

    def model(self):
        return CharGRU(self.vocab, 64, 128)

    def optimizer(self, params, kind="default"):
        return make_optimizer(params, "adam" if kind == "default" else kind, sgd_lr=0.5, adam_lr=3e-3)

    def loss(self, out, y):
        return F.cross_entropy(out.reshape(-1, self.vocab), y.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model):
        out = model(self.val_x)
        loss = self.loss(out, self.val_y).item()
        acc = (out.argmax(-1) == self.val_y).float().mean().item()
        return loss, acc


class CharGRU(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.GRU(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


class Classification:
    """What the two classification tasks share: SGD (lr 0.05) by default,
    cross-entropy, and held-out loss and accuracy on self.test_x/test_y."""

    def optimizer(self, params, kind="default"):
        return make_optimizer(params, "sgd" if kind == "default" else kind, sgd_lr=0.05, adam_lr=1e-3)

    def loss(self, out, y):
        return F.cross_entropy(out, y)

    @torch.no_grad()
    def evaluate(self, model):
        out = model(self.test_x)
        return self.loss(out, self.test_y).item(), (out.argmax(1) == self.test_y).float().mean().item()


class NoisyDigits(Classification):
    name = "cnn"
    metric = "test accuracy"
    ddp_kwargs = {}

    def __init__(self, seed, batch=32):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.from_numpy((digits.data / 16.0).astype(np.float32)).reshape(-1, 1, 8, 8)
        x = F.interpolate(x, size=(12, 12), mode="bilinear", align_corners=False)
        y = torch.from_numpy(digits.target.astype(np.int64))
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(x), generator=gen)
        x, y = x[perm], y[perm]
        n_test = 360
        self.train_x, self.train_y = x[n_test:], y[n_test:]
        # A fixed distorted test set: the same distortions as training.
        self.test_x = self._distort(x[:n_test], torch.Generator().manual_seed(seed + 7))
        self.test_y = y[:n_test]
        self.batch, self.seed = batch, seed

    @staticmethod
    def _distort(x12, gen):
        """Places each 12x12 digit at a random offset in a 16x16 frame, with
        random contrast and Gaussian pixel noise."""
        n = len(x12)
        out = torch.zeros(n, 1, 16, 16)
        offs = torch.randint(0, 5, (n, 2), generator=gen)
        for i in range(n):
            r, c = offs[i].tolist()
            out[i, :, r:r + 12, c:c + 12] = x12[i]
        contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=gen)
        return out * contrast + 0.35 * torch.randn(out.shape, generator=gen)

    def batch_at(self, rank, world, step):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 131 + rank)
        idx = torch.randint(0, len(self.train_x), (self.batch,), generator=gen)
        return self._distort(self.train_x[idx], gen), self.train_y[idx]

    def model(self):
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


class MixedBuckets(Classification):
    name = "mixed"
    metric = "held-out accuracy"
    # Buckets (built from the last parameter backwards): 314k elements
    # (the 262k matrix and every layer after it), 34k, 8.6k (dense).
    ddp_kwargs = {"bucket_cap_mb": 0.1}

    def __init__(self, seed, batch=32, dim=64, classes=10):
        self.batch, self.seed, self.dim, self.classes = batch, seed, dim, classes
        gen = torch.Generator().manual_seed(seed + 55)
        # The teacher: a fixed random two-layer network with a clear margin.
        self.w1 = torch.randn(dim, 128, generator=gen) / math.sqrt(dim)
        self.w2 = torch.randn(128, classes, generator=gen) / math.sqrt(128)
        self.test_x = torch.randn(2000, dim, generator=torch.Generator().manual_seed(seed + 9))
        self.test_y = self._label(self.test_x)

    def _label(self, x):
        return (torch.tanh(x @ self.w1) @ self.w2).argmax(1)

    def batch_at(self, rank, world, step):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 131 + rank)
        x = torch.randn(self.batch, self.dim, generator=gen)
        return x, self._label(x)

    def model(self):
        layers = []
        for _ in range(2):  # small input layers: the last bucket, below COMPCOLL_MIN_ELEMS
            layers += [nn.Linear(self.dim, self.dim), nn.LayerNorm(self.dim), nn.ReLU()]
        layers += [nn.Linear(self.dim, 512), nn.LayerNorm(512), nn.ReLU(),
                  nn.Linear(512, 512), nn.LayerNorm(512), nn.ReLU(),
                  nn.Linear(512, 64), nn.ReLU()]
        for _ in range(2):  # small tensors sharing the first bucket with the 262k matrix
            layers += [nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU()]
        layers.append(nn.Linear(64, self.classes))
        return nn.Sequential(*layers)


TASKS = {t.name: t for t in (LanguageModel, NoisyDigits, MixedBuckets)}
