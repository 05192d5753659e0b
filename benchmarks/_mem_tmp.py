import sys, importlib
import _common  # noqa
import jax
import bench_first_call as B
mod, fn = {"hand": ("models_hand", "make"), "mlaxgraph": ("models_mg", "make"), "equinox": ("models_equinox", "make")}[sys.argv[1]]
make = getattr(importlib.import_module(mod), fn)
x, y = B._data("mlp")
run = make("mlp", x, y, jax.random.key(0))
c = run.lower().compile()
m = c.memory_analysis()
print(sys.argv[1], "arg", m.argument_size_in_bytes, "out", m.output_size_in_bytes, "temp", m.temp_size_in_bytes, "alias", m.alias_size_in_bytes)
