"""The demo. For now it shows the symbolic simplifier on the index arithmetic a reshape produces; the MNIST
training demo replaces it once the runtime exists (it says so rather than pretend)."""
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.symbolic import Variable, simplify


def main() -> None:
  print("rawgrad demo: the tensor runtime is not built yet; this shows the symbolic index algebra it rests on.\n")
  r0, r1, r2 = UOp.range(4, 0), UOp.range(3, 1), UOp.range(12, 2)
  n = Variable("n", 1, 64)
  examples = [(r0 * 4 + r1) // 4, (r0 * 4 + r1) % 4, (r2 // 4) * 4 + r2 % 4, ((r0 * 12 + r2) // 4) % 3,
              (n * 6 + 4) % 2, r0 - 1 < 3]
  for expression in examples:
    print(f"  {expression.render():<32} -> {simplify(expression).render()}")


if __name__ == "__main__":
  main()
