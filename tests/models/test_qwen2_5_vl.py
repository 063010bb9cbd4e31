"""The qwen2_5_vl model against transformers' Qwen2_5_VLForConditionalGeneration (tiny random
config, float32, eager attention), given the same patches and grids:
- the vision tower alone, several items of different grids in one batch (== one by one);
- the 3-D M-RoPE positions and decode offset;
- logits of an image prompt and a video prompt through mimo's paged engine (whole and chunked
  prefill, chunks cutting through the media), and greedy decoding after them."""
import pytest
import torch

from mimo import LLM, SamplingParams
from mimo.models.hf_config import model_config_from_hf
from mimo.models.hf_loader import _canonical
from mimo.models.qwen2_5_vl_vision import split_embeds
from mimo.models.registry import LoadedModel
from mimo.multimodal.adapters.qwen2_5_vl import build_mm_prompt, get_rope_index

IMG, VID, VSTART, VEND = 300, 301, 302, 303
PATCH_DIM = 3 * 2 * 14 * 14


def tiny_qwen2_5_vl_hf(seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=320, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=None,
                         eos_token_id=1, rope_parameters={"rope_type": "default",
                                                          "mrope_section": [2, 3, 3],
                                                          "rope_theta": 10_000.0}),
        # window 56 px = 2x2 merged units: a 8x12-patch image has 6 windows, edge ones smaller
        vision_config=dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2,
                           out_hidden_size=64, fullatt_block_indexes=[1, 3], window_size=56,
                           tokens_per_second=2),
        image_token_id=IMG, video_token_id=VID, vision_start_token_id=VSTART,
        vision_end_token_id=VEND)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():   # non-trivial norms and biases
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name or "ln_q" in name else 0.0, 0.3 if "norm" in name else 0.08)
    return model


@pytest.fixture(scope="module")
def pair():
    ref = tiny_qwen2_5_vl_hf()
    weights = {_canonical(k): v.detach().clone() for k, v in ref.state_dict().items()}
    loaded = LoadedModel(model_config_from_hf(ref.config.to_dict()), weights, None, "tiny")
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="2MiB", page_size=8,
              progress=False)
    yield ref, llm
    llm.engine.check_integrity()


def _patches(grid, seed):
    n = int(torch.tensor(grid).prod())
    return torch.randn(n, PATCH_DIM, generator=torch.Generator().manual_seed(seed))


def test_config_maps(pair):
    _, llm = pair
    mc = llm.engine.model_config
    assert mc.arch == "qwen2_5_vl" and mc.layer_types == ("full", "full")
    assert mc.mrope_section == (2, 3, 3) and mc.attention_bias
    v = mc.vision
    assert (v.depth, v.fullatt_block_indexes, v.window_size, v.image_token_id) == (4, (1, 3), 56, IMG)


def test_vision_batched_matches_transformers_and_separate(pair):
    ref, llm = pair
    grids = [[1, 8, 12], [2, 6, 4], [1, 4, 4], [1, 14, 10], [3, 8, 8]]
    px = [_patches(g, i) for i, g in enumerate(grids)]
    g = torch.tensor(grids)
    ours = llm.engine.model.encode(torch.cat(px), g)
    with torch.no_grad():
        want = ref.model.visual(torch.cat(px), grid_thw=g).pooler_output
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=0)
    parts = split_embeds(ours, g)
    assert [p.shape[0] for p in parts] == [t * h * w // 4 for t, h, w in grids]
    for p, x, gr in zip(parts, px, grids):
        alone = llm.engine.model.encode(x, torch.tensor([gr]))
        torch.testing.assert_close(p, alone, atol=1e-5, rtol=0)


def _prompt(kind_tok, n_media, seed):
    gen = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(4, 290, (n,), generator=gen).tolist()  # noqa: E731
    return text(5) + [VSTART] + [kind_tok] * n_media + [VEND] + text(9)


def _ref_inputs(ids, kind_tok):
    t = torch.tensor([ids])
    return t, (t == IMG).int() + 2 * (t == VID).int()


def _positions(pair, grid, secs):
    ref, llm = pair
    video = secs is not None
    tok = VID if video else IMG
    ids = _prompt(tok, grid[0] * grid[1] * grid[2] // 4, 0) * 2   # two items
    t, types = _ref_inputs(ids, tok)
    g = torch.tensor([grid, grid])
    kw = dict(video_grid_thw=g, second_per_grid_ts=torch.tensor(secs * 2)) if video else \
        dict(image_grid_thw=g)
    want, delta = ref.model.get_rope_index(t, types, **kw)
    ours, d = get_rope_index(ids, llm.engine.model_config.vision, **{
        k: (v.tolist() if k != "second_per_grid_ts" else secs * 2) for k, v in kw.items()})
    return ids, ours, d, want[:, 0], int(delta)


# Frames 0.5 s apart at 2 tokens/s: temporal step 1, fractional interval kept until the floor.
@pytest.mark.parametrize("grid,secs", [([1, 8, 12], None), ([2, 8, 8], [1.0]), ([2, 4, 4], [0.5])])
def test_mrope_positions_match_transformers(pair, grid, secs):
    _, ours, d, want, delta = _positions(pair, grid, secs)
    assert torch.equal(ours, want) and d == delta


def test_text_after_video_resumes_past_its_last_frame(pair):
    """Where a video spans more time than space (3 frames at step 1 on a 2x2 merged grid),
    Qwen's original rule (text resumes at the item's max position + 1, as in the reference
    implementation of PR huggingface/transformers#35569, and vLLM) and transformers 5.24 (text
    resumes at start + max(h, w) / merge, behind the later frames) differ. We keep the rule
    the checkpoints were trained with: everything up to the end of the first video matches
    transformers, and text then continues at max + 1."""
    ids, ours, d, want, _ = _positions(pair, [3, 4, 4], [0.5])
    end = ids.index(VEND)
    assert torch.equal(ours[:, :end], want[:, :end])
    assert torch.equal(ours[:, end], torch.full((3,), int(ours[:, :end].max()) + 1))
    assert d == int(ours.max()) + 1 - len(ids)


def _case(pair, video):
    ref, llm = pair
    grid = [2, 8, 8] if video else [1, 8, 12]
    tok = VID if video else IMG
    ids = _prompt(tok, grid[0] * grid[1] * grid[2] // 4, 1 + video)
    px = _patches(grid, 7)
    g = torch.tensor([grid])
    t, types = _ref_inputs(ids, tok)
    if video:
        kw = dict(pixel_values_videos=px, video_grid_thw=g, second_per_grid_ts=torch.tensor([1.0]))
    else:
        kw = dict(pixel_values=px, image_grid_thw=g)
    emb = llm.engine.model.encode(px, g)
    mmp = build_mm_prompt(ids, llm.engine.model_config.vision,
                          **({"video_embeds": [emb], "video_grid_thw": [grid],
                               "second_per_grid_ts": [1.0]} if video else
                              {"image_embeds": [emb], "image_grid_thw": [grid]}))
    return ref, llm, ids, t, types, kw, mmp


@pytest.mark.parametrize("video", [False, True], ids=["image", "video"])
@pytest.mark.parametrize("chunk", [None, 7, 16])
def test_logits_match_transformers(pair, video, chunk):
    ref, llm, ids, t, types, kw, mmp = _case(pair, video)
    with torch.no_grad():
        want = ref(input_ids=t, mm_token_type_ids=types, **kw).logits[0]
    ours = llm.engine.prompt_logits(ids, chunk=chunk, mm=mmp)
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("video", [False, True], ids=["image", "video"])
def test_greedy_decode_matches_transformers_generate(pair, video):
    ref, llm, ids, t, types, kw, mmp = _case(pair, video)
    with torch.no_grad():
        want = ref.generate(input_ids=t, mm_token_type_ids=types, **kw, max_new_tokens=8,
                            min_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids):]
    eng = llm.engine
    seq = eng.add_request(ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), mm=mmp)
    while seq.finish_reason is None:
        eng.step()
    assert seq.output_ids == want.tolist()


def test_text_and_media_sequences_share_a_step(pair):
    """A text-only sequence batched with a multimodal one gets the same tokens as alone."""
    ref, llm, ids, t, types, kw, mmp = _case(pair, False)
    eng = llm.engine
    text = [7, 8, 9, 10, 11]
    p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    alone = eng.add_request(text, p)
    while alone.finish_reason is None:
        eng.step()
    a, b = eng.add_request(text, p), eng.add_request(ids, p, mm=mmp)
    while a.finish_reason is None or b.finish_reason is None:
        eng.step()
    assert a.output_ids == alone.output_ids
    with torch.no_grad():
        want = ref.generate(input_ids=t, mm_token_type_ids=types, **kw, max_new_tokens=4,
                            min_new_tokens=4, do_sample=False, pad_token_id=0)[0, len(ids):]
    assert b.output_ids == want.tolist()


def test_image_and_video_in_one_prompt(pair):
    """Items of both kinds interleaved with text: placement by kind, positions in order."""
    ref, llm = pair
    gi, gv = [1, 8, 12], [2, 8, 8]
    a, b = _prompt(IMG, 24, 5), _prompt(VID, 32, 6)
    ids = a + b + a[:3]
    pi, pv = _patches(gi, 8), _patches(gv, 9)
    t = torch.tensor([ids])
    types = (t == IMG).int() + 2 * (t == VID).int()
    with torch.no_grad():
        want = ref(input_ids=t, mm_token_type_ids=types, pixel_values=pi,
                   image_grid_thw=torch.tensor([gi]), pixel_values_videos=pv,
                   video_grid_thw=torch.tensor([gv]),
                   second_per_grid_ts=torch.tensor([1.0])).logits[0]
    model = llm.engine.model
    # One encoder forward for both items, split back per item.
    ei, ev = split_embeds(model.encode(torch.cat([pi, pv]), [gi, gv]), [gi, gv])
    mmp = build_mm_prompt(ids, llm.engine.model_config.vision, image_embeds=[ei],
                          image_grid_thw=[gi], video_embeds=[ev], video_grid_thw=[gv],
                          second_per_grid_ts=[1.0])
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=11, mm=mmp), want,
                               atol=1e-4, rtol=0)


def test_mismatched_media_is_an_error(pair):
    vision = pair[1].engine.model_config.vision
    ids = [5, VSTART] + [IMG] * 4 + [VEND]
    with pytest.raises(ValueError, match="placeholders than image grids"):
        get_rope_index(ids, vision)
    with pytest.raises(ValueError, match="in a row"):
        get_rope_index(ids, vision, image_grid_thw=[[1, 4, 6]])      # 6 tokens needed
    with pytest.raises(ValueError, match="grids given"):
        get_rope_index(ids, vision, image_grid_thw=[[1, 4, 4], [1, 4, 4]])
    with pytest.raises(ValueError, match="embeddings"):
        build_mm_prompt(ids, vision, image_embeds=[torch.zeros(3, 64)],
                        image_grid_thw=[[1, 4, 4]])
