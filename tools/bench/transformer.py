"""A small GPT's training step (token and position embeddings, 2 pre-norm blocks of causal attention and a GELU MLP, a
head of its own, cross entropy, AdamW): rawgrad's jitted step against torch's eager one on the same shapes, both on
this machine's cores. Its kernels are what a language model's are: linear layers as x @ W.T, attention, layer
norms, an embedding's gradient (a scatter) and a vocabulary-wide softmax."""
from __future__ import annotations

import _isa  # noqa: F401 - first: with CPU_ISA=avx2 the references run AVX2 code too
import time

import numpy as np

from _timing import guarded, torch

from rawgrad import GlobalCounters, Tensor, jit
from rawgrad.nn import Embedding, LayerNorm, Linear
from rawgrad.nn.optim import AdamW

VOCAB, WIDTH, HEADS, LAYERS, BATCH, CONTEXT = 2048, 128, 4, 2, 16, 128
STEPS = 10


class Block:
  def __init__(self) -> None:
    self.norm1, self.norm2 = LayerNorm(WIDTH), LayerNorm(WIDTH)
    self.qkv, self.out = Linear(WIDTH, 3 * WIDTH), Linear(WIDTH, WIDTH)
    self.up, self.down = Linear(WIDTH, 4 * WIDTH), Linear(4 * WIDTH, WIDTH)

  def __call__(self, x: Tensor) -> Tensor:
    heads = self.qkv(self.norm1(x)).reshape(BATCH, CONTEXT, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
    q, k, v = heads[0], heads[1], heads[2]
    attended = q.scaled_dot_product_attention(k, v, is_causal=True).permute(0, 2, 1, 3).reshape(BATCH, CONTEXT, WIDTH)
    x = x + self.out(attended)
    return x + self.down(self.up(self.norm2(x)).gelu(approximate="tanh"))

  def parameters(self) -> list[Tensor]:
    return [p for m in (self.norm1, self.norm2, self.qkv, self.out, self.up, self.down) for p in m.parameters()]


def rawgrad_step() -> tuple[float, int]:
  """Best step time in seconds, and kernels per step."""
  tokens, positions = Embedding(VOCAB, WIDTH), Embedding(CONTEXT, WIDTH)
  blocks = [Block() for _ in range(LAYERS)]
  norm, head = LayerNorm(WIDTH), Linear(WIDTH, VOCAB)
  parameters = [tokens.weight, positions.weight, *[p for b in blocks for p in b.parameters()], *norm.parameters(),
                *head.parameters()]
  optimizer = AdamW(parameters, lr=1e-3)
  where = Tensor(np.arange(CONTEXT, dtype=np.int32))

  @jit
  def step(inputs: Tensor, targets: Tensor) -> Tensor:
    optimizer.zero_grad()
    x = tokens(inputs) + positions(where)
    for block in blocks: x = block(x)
    loss = head(norm(x)).reshape(BATCH * CONTEXT, VOCAB).cross_entropy(targets.reshape(BATCH * CONTEXT))
    loss.backward()
    optimizer.step()
    return loss
  batches = _batches()
  for i in range(3): step(*(Tensor(a) for a in batches[i % len(batches)])).item()
  GlobalCounters.reset()
  step(*(Tensor(a) for a in batches[0])).item()
  kernels = GlobalCounters.kernel_count
  best = float("inf")
  for i in range(STEPS):
    inputs, targets = (Tensor(a) for a in batches[i % len(batches)])
    start = time.perf_counter()
    step(inputs, targets).item()
    best = min(best, time.perf_counter() - start)
  return best, kernels


def torch_step() -> float:
  nn = torch.nn

  class TorchBlock(nn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
      self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
      self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):  # noqa: ANN001, ANN202 - torch's module signature
      q, k, v = self.qkv(self.norm1(x)).reshape(BATCH, CONTEXT, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
      attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
      x = x + self.out(attended.permute(0, 2, 1, 3).reshape(BATCH, CONTEXT, WIDTH))
      return x + self.down(nn.functional.gelu(self.up(self.norm2(x)), approximate="tanh"))

  model = nn.ModuleList([nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH),
                         *[TorchBlock() for _ in range(LAYERS)], nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)])
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
  where = torch.arange(CONTEXT)

  def step(inputs, targets) -> float:  # noqa: ANN001 - torch tensors
    optimizer.zero_grad()
    x = model[0](inputs) + model[1](where)
    for block in model[2:2 + LAYERS]: x = block(x)
    loss = nn.functional.cross_entropy(model[-1](model[-2](x)).reshape(BATCH * CONTEXT, VOCAB),
                                       targets.reshape(BATCH * CONTEXT))
    loss.backward()
    optimizer.step()
    return loss.item()
  batches = [tuple(torch.from_numpy(a).long() for a in batch) for batch in _batches()]
  for i in range(3): step(*batches[i % len(batches)])
  best = float("inf")
  for i in range(STEPS):
    start = time.perf_counter()
    step(*batches[i % len(batches)])
    best = min(best, time.perf_counter() - start)
  return best


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
  rng = np.random.default_rng(0)
  return [tuple(rng.integers(0, VOCAB, (BATCH, CONTEXT)).astype(np.int32) for _ in range(2)) for _ in range(4)]


def main() -> None:
  # torch first: once rawgrad's CPU worker threads exist, torch's thread pool shares the cores with them
  theirs = torch_step() if torch is not None else None
  ours, kernels = rawgrad_step()
  line = f"GPT train step ({LAYERS} layers, width {WIDTH}, {BATCH}x{CONTEXT} tokens, vocabulary {VOCAB}, jit): " \
         f"{ours * 1e3:.1f} ms, {kernels} kernels"
  if theirs is not None: line += f"; torch eager {theirs * 1e3:.1f} ms = {ours / theirs:.2f}x torch's time"
  print(line, flush=True)


if __name__ == "__main__":
  guarded(main)
