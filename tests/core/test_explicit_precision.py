"""Every product of float32 data in the core names its precision: a TPU rounds a default-precision
product's operands to bfloat16 (2.4e-3 relative error on a 512x512 product, docs/accelerator.md's probe) and
a GPU to TF32, so one left at the default gives the accelerators other answers than the CPU. The stitching's
Gauss-Newton products and the refinement's interpolation weights were such products: two stitching tests
failed on a TPU for them."""

from __future__ import annotations

import ast
from pathlib import Path

import napari_gridmip

PRODUCTS = {"einsum", "dot", "matmul", "tensordot", "inner", "vdot", "outer", "conv", "conv_general_dilated"}
CORE = Path(napari_gridmip.__file__).parent / "core"


def _jax_modules() -> list[Path]:
    return [p for p in sorted(CORE.rglob("*.py")) if "jax.numpy" in p.read_text() or "from jax" in p.read_text()]


def test_every_jax_product_names_its_precision():
    missing = []
    for path in _jax_modules():
        tree = ast.parse(path.read_text())
        numpy_names = {"np", "numpy"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PRODUCTS:
                owner = node.func.value
                while isinstance(owner, ast.Attribute):  # np.multiply.outer: its root is np
                    owner = owner.value
                if isinstance(owner, ast.Name) and owner.id in numpy_names:
                    continue  # NumPy's products run on the host, in the data's precision
                if not any(k.arg in ("precision", "preferred_element_type") for k in node.keywords):
                    missing.append(f"{path.relative_to(CORE)}:{node.lineno} {ast.unparse(node.func)}")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                missing.append(f"{path.relative_to(CORE)}:{node.lineno} @ (use jnp.matmul(..., precision=...))")
    assert not missing, "products at the default precision:\n" + "\n".join(missing)
