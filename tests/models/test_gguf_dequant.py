"""GGUF dequantization in torch (mimo/models/gguf_dequant.py) against the `gguf` package's
numpy code, the reference it replaced: bit for bit in float32, and after the cast to the
model's dtype; then whole files (Gemma 3's Q5_0/Q4_K/Q6_K/Q8_0, SmolLM2's Q4_1 with llama's
q/k row permutation) and the model built from them."""
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as package_dequantize

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.models import gguf_dequant, registry
from mimo.models.gguf_dequant import DECODERS, dequantize
from mimo.models.gguf_loader import (
    _format,
    _hf_name,
    gguf_blocks,
    gguf_weights,
    open_gguf,
    start_dense,
    weight_slots,
)
from mimo.models.layers import STACKED_ROWS

IQ4_NL = int(GGMLQuantizationType.IQ4_NL)       # no decoder here: the package's, then the cast
TYPES = [0, *sorted(DECODERS), IQ4_NL]
# byte offsets of each block type's fp16 scale fields
FP16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 10: [80, 82], 11: [108],
               12: [0, 2], 13: [0, 2], 14: [208], IQ4_NL: [0]}
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
BUILDS = [i for i in ISAS if cpu_info().supports(i)]
# the types the extension's start_dequantize decodes (csrc/dequant.cpp); the others stay in
# Python (gguf_weights)
EXT_TYPES = [1, 2, 3, 6, 7, 8, 12, 13, 14, 30]


def _random_tensor(qtype: int, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, tuple]:
    """A tensor's bytes: random quants; scales finite, of both signs, zero and subnormal
    ones among them (every block type); random finite values for the float types."""
    elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    cols = elems * 3 if elems > 1 else 96
    if qtype == 0:
        return rng.standard_normal(rows * cols).astype(np.float32).view(np.uint8), (rows, cols)
    if qtype == 1:
        return rng.standard_normal(rows * cols).astype(np.float16).view(np.uint8), (rows, cols)
    if qtype == 30:     # bf16: the top halves of random float32s
        top = rng.standard_normal(rows * cols).astype(np.float32).view(np.uint32) >> 16
        return top.astype(np.uint16).view(np.uint8), (rows, cols)
    nb = rows * cols // elems
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        scale = rng.uniform(-0.05, 0.05, nb).astype(np.float16)
        scale[::7] = 0
        scale[1::7] = np.float16(3e-7) * rng.choice([-1, 1], len(scale[1::7]))   # subnormal
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1), (rows, cols)


def _package(data: np.ndarray, qtype: int, shape: tuple) -> torch.Tensor:
    arr = package_dequantize(data.reshape(shape[0], -1), GGMLQuantizationType(qtype))
    return torch.from_numpy(np.array(arr, dtype=np.float32)).reshape(shape)    # a copy


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: GGMLQuantizationType(q).name)
def test_blocks_decode_bit_for_bit_as_the_package_does(qtype, monkeypatch):
    # slices of a few blocks: many slices per tensor, the last one partial
    monkeypatch.setattr(gguf_dequant, "SLICE", 3 * 256 + 64)
    rng = np.random.default_rng(qtype)
    data, shape = _random_tensor(qtype, 41, rng)
    want = _package(data, qtype, shape)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = dequantize(data, qtype, shape, dtype)
        assert _same_bits(got, want.to(dtype)), (GGMLQuantizationType(qtype).name, dtype)


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("qtype", EXT_TYPES, ids=lambda q: GGMLQuantizationType(q).name)
def test_extension_decodes_bit_for_bit_as_the_package_does(isa, qtype):
    """The extension's decoder thread (csrc/dequant.cpp), each build this CPU runs: several
    tensors of one row and of 41 in one call, float32 and bfloat16, every value the
    package's float32 one (cast as torch casts); outputs start as NaN, so a value left
    unwritten fails too."""
    ext = extension.load(isa)
    rng = np.random.default_rng(100 + qtype)
    tensors = [_random_tensor(qtype, rows, rng) for rows in (1, 41, 3)]
    for dtype in (torch.float32, torch.bfloat16):
        outs = [torch.full(shape, float("nan"), dtype=dtype) for _, shape in tensors]
        handle = ext.start_dequantize([torch.from_numpy(d) for d, _ in tensors],
                                      [qtype] * len(tensors), outs)
        handle.wait()
        handle.wait()                                # a second wait is a no-op
        for (data, shape), out in zip(tensors, outs):
            assert _same_bits(out, _package(data, qtype, shape).to(dtype)), (shape, dtype)


@pytest.mark.parametrize("isa", BUILDS)
def test_extension_refuses_what_it_cannot_decode_before_it_starts(isa):
    ext = extension.load(isa)
    assert [q for q in TYPES if ext.dequant_type(q)] == EXT_TYPES
    src = torch.zeros(34 * 3, dtype=torch.uint8)
    for qtypes, out, match in [([8], torch.empty(4, 32), "are not 128 values"),
                               ([10], torch.empty(3, 32), "no decoder for GGML type 10"),
                               ([8], torch.empty(3, 32, dtype=torch.float16), "float32 or bfloat16"),
                               ([8, 8], torch.empty(3, 32), "as long as each other")]:
        with pytest.raises(RuntimeError, match=match):
            ext.start_dequantize([src], qtypes, [out])


def test_a_tensor_of_the_wrong_size_is_refused():
    data = np.zeros(34 * 3, dtype=np.uint8)
    with pytest.raises(ValueError, match="not 128 elements"):
        dequantize(data, 8, (4, 32))


def test_one_thread_restores_the_thread_count():
    n = torch.get_num_threads()
    with gguf_dequant.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == n


@pytest.mark.parametrize("started", [False, True], ids=["python", "extension"])
@pytest.mark.parametrize("model", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_file_weights_in_the_model_dtype_are_the_package_values_cast(model, started):
    """Every tensor of the file: matrices in bfloat16, equal to the package's float32 values
    (after the family's conversion to HF conventions) cast; vectors the float32 values.
    `started`: the matrices the extension decodes (all but llama's permuted q/k rows) come
    from its thread (`start_dense`), the rest from Python."""
    f = open_gguf(registry.resolve(model))
    try:
        slots, dense = None, None
        if started:
            assert extension.load() is not None and extension.loaded() is not None
            slots = weight_slots(f, torch.bfloat16)[1]
            dense = start_dense(f, torch.bfloat16, slots)
            assert dense is not None
            permuted = {n for n in slots if n.endswith(("q_proj.weight", "k_proj.weight"))}
            assert dense.names == (set(slots) - permuted if model.startswith("smollm2")
                                   else set(slots))
        ours = gguf_weights(f, progress=False, dtype=torch.bfloat16, slots=slots,
                            started=dense)
        arch, fmt = _format(f)
        assert len(ours) == len(f.tensors)
        for t in f.tensors.values():
            want = _package(np.frombuffer(f._buf, dtype=np.uint8, count=t.nbytes,
                                          offset=t.offset), t.qtype, t.shape)
            want = fmt.to_hf(t.name, want, f.metadata) if fmt.to_hf else want
            got = ours[_hf_name(t.name, arch, fmt.names)]
            assert _same_bits(got, want.to(torch.bfloat16) if want.dim() > 1 else want), t.name
    finally:
        f.close()


@pytest.mark.parametrize("model", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_file_blocks_decode_to_the_weights(model):
    """gguf_blocks, from copies of their own and from views of copy_data's one copy (llama's
    q/k rows permuted as the weights are): each tensor's blocks, decoded by the package,
    are its float32 weights, and the views hold the same bytes as the copies."""
    f = open_gguf(registry.resolve(model))
    try:
        weights, own = gguf_weights(f, progress=False), gguf_blocks(f)
        f.copy_data()
        views = gguf_blocks(f)
    finally:
        f.close()
    assert len(own) > len(weights) // 3 and set(own) <= set(weights) and own.keys() == views.keys()
    for name, part in own.items():
        assert torch.equal(part.dequantize(), weights[name]), name
        assert torch.equal(views[name].data, part.data) and views[name].qtype == part.qtype
    stores = {p.data.untyped_storage().data_ptr() for n, p in views.items()
              if not n.endswith(("q_proj.weight", "k_proj.weight"))}
    assert len(stores) == 1         # one copy (llama's q/k rows are reordered copies)


def test_model_built_from_the_bf16_load_equals_the_one_built_from_float32(gemma_loaded):
    """The engine's load (matrices straight to bfloat16) builds the same model, parameter for
    parameter and buffer for buffer, as the float32 weights cast by the model did."""
    cfg = gemma_loaded.config
    old = registry.build_model(cfg, gemma_loaded.weights, torch.bfloat16)
    f = open_gguf(gemma_loaded.source)
    try:
        w = gguf_weights(f, False, torch.bfloat16)
    finally:
        f.close()
    new = registry.build_model(cfg, w, torch.bfloat16)
    a, b = old.state_dict(keep_vars=True), new.state_dict(keep_vars=True)
    assert a.keys() == b.keys()
    for k in a:
        assert _same_bits(a[k].detach(), b[k].detach()), k
    # the stacked projections took the loader's buffers as they were
    for i, layer in enumerate(new.layers):
        for lin, first in ((layer.attn.qkv, "self_attn.q_proj"), (layer.mlp.gate_up, "mlp.gate_proj")):
            assert lin.weight.data_ptr() == w[f"model.layers.{i}.{first}.weight"].data_ptr()


def test_stack_rows_is_cat_and_a_view_only_of_consecutive_rows():
    from mimo.models.layers import stack_rows
    buf = torch.randn(10, 4)
    a, b, c = buf[:3], buf[3:5], buf[5:]
    for parts, dtype, view in [([a, b, c], torch.float32, True),
                               ([a, b], torch.float32, True),
                               ([b, c], torch.float32, True),
                               ([a, c], torch.float32, False),      # a gap
                               ([b, a], torch.float32, False),      # out of order
                               ([a, b, c], torch.bfloat16, False),  # another dtype: a cast
                               ([a, buf[3:5].clone()], torch.float32, False),   # two buffers
                               ([buf[:, :2], buf[:, 2:]], torch.float32, False)]:
        got = stack_rows(parts, dtype)
        assert _same_bits(got, torch.cat(parts).to(dtype))
        assert (got.data_ptr() == parts[0].data_ptr() and got.untyped_storage().data_ptr()
                == buf.untyped_storage().data_ptr()) == view


@pytest.mark.parametrize("model", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_weight_slots_lay_every_matrix_out_once_in_one_buffer(model):
    f = open_gguf(registry.resolve(model))
    try:
        arch, fmt = _format(f)
        shapes = {_hf_name(t.name, arch, fmt.names): t.shape for t in f.tensors.values()}
        buf, slots = weight_slots(f, torch.bfloat16)
    finally:
        f.close()
    assert slots.keys() == {n for n, s in shapes.items() if len(s) >= 2}
    spans = []
    for n, v in slots.items():
        assert v.shape == shapes[n] and v.dtype == torch.bfloat16 and v.is_contiguous()
        assert v.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        spans.append((v.data_ptr(), v.data_ptr() + v.nbytes, n))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "slots overlap"
    starts = {n: p for p, _, n in spans}
    groups = 0
    for n in slots:
        for group in STACKED_ROWS:
            if n.endswith(f".{group[0]}.weight"):
                prefix = n[: -len(f"{group[0]}.weight")]
                members = [slots[f"{prefix}{g}.weight"] for g in group]
                for a, b in zip(members, members[1:]):
                    assert b.data_ptr() == a.data_ptr() + a.nbytes, n
                groups += 1
    assert groups == 2 * sum(n.endswith("self_attn.q_proj.weight") for n in slots)
    # a run (a group, or a lone matrix) starts on 64 bytes
    assert all(starts[n] % 64 == 0 for n in slots if not any(
        n.endswith(f".{g}.weight") for group in STACKED_ROWS for g in group[1:]))


def test_registry_load_gives_the_weights_gguf_weights_gives(gemma_loaded):
    """The engine's load (blocks copied and the matrices decoded on the extension's thread
    while the tokenizer loads) holds the same weights and blocks as the plain functions."""
    assert extension.load() is not None
    loaded = registry.load("gemma-3-270m", progress=False, dtype=torch.bfloat16)
    f = open_gguf(loaded.source)
    try:
        weights, blocks = gguf_weights(f, False, torch.bfloat16), gguf_blocks(f)
    finally:
        f.close()
    assert loaded.weights.keys() == weights.keys() and loaded.blocks.keys() == blocks.keys()
    for k, w in weights.items():
        assert _same_bits(loaded.weights[k], w), k
    for k, b in blocks.items():
        assert torch.equal(loaded.blocks[k].data, b.data), k
    assert loaded.tokenizer.encode("Hello world") == gemma_loaded.tokenizer.encode("Hello world")
