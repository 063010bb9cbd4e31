"""mimo.models.tiny.qwen2_5_vl writes a checkpoint directory that transformers and mimo both
load, and that gives the same logits in both for an image chat prompt."""
import json

import pytest
import torch

from mimo import LLM
from mimo.models import registry
from mimo.models.chat_template import ChatTemplate
from mimo.models.tiny import qwen2_5_vl as tiny
from mimo.multimodal.adapters.qwen2_5_vl import build_mm_prompt
from mimo.multimodal.mm_prompt import MMPrompt


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    tiny.write(d, seed=3)
    return d


def test_writes_the_files_a_checkpoint_has(tiny_dir):
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "preprocessor_config.json", "generation_config.json"):
        assert (tiny_dir / f).is_file(), f
    assert json.loads((tiny_dir / "config.json").read_text())["model_type"] == "qwen2_5_vl"


def test_same_seed_same_checkpoint(tiny_dir, tmp_path):
    tiny.write(tmp_path, seed=3)
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / f).read_bytes() == (tiny_dir / f).read_bytes(), f


def test_tokenizer_and_chat_template_match_transformers(tiny_dir):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(tiny_dir))
    tok = registry.load(str(tiny_dir), progress=False).tokenizer
    for s in tiny.SPECIAL:
        assert tok.encode(s, add_special_tokens=False) == [ref.convert_tokens_to_ids(s)]
    msgs = [{"role": "user", "content": "What is in this picture? 42"}]
    want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ChatTemplate.for_model(tok, "qwen2_5_vl").encode(tok, msgs) == list(want)
    assert tok.token_to_id("<|im_end|>") in tok.eos_token_ids


def test_image_prompt_logits_match_transformers(tiny_dir):
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
    ref = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(tiny_dir), attn_implementation="eager").float().eval()
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    msgs = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "Describe the image."}]}]
    text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    grid = [1, 12, 20]          # 168 x 280 px: 3x5 merged units, two 112-px window columns
    n = grid[0] * grid[1] * grid[2] // 4
    ids = hf_tok(text.replace("<|image_pad|>", "<|image_pad|>" * n))["input_ids"]
    px = torch.randn(grid[0] * grid[1] * grid[2], 3 * 2 * 14 * 14,
                     generator=torch.Generator().manual_seed(0))
    t = torch.tensor([ids])
    img = ref.config.image_token_id
    with torch.no_grad():
        want = ref(input_ids=t, pixel_values=px, image_grid_thw=torch.tensor([grid]),
                   mm_token_type_ids=(t == img).int()).logits[0]
    llm = LLM(str(tiny_dir), dtype="float32", kv_cache_memory="2MiB", page_size=8,
              progress=False)
    model = llm.engine.model
    mmp = build_mm_prompt(ids, llm.engine.model_config.vision,
                          image_embeds=[model.encode(px, [grid])], image_grid_thw=[grid])
    torch.testing.assert_close(llm.engine.prompt_logits(ids, mm=mmp), want, atol=1e-4, rtol=0)
    llm.engine.check_integrity()


def _old_layout(src, dst):
    """The checkpoint as Qwen2.5-VL was published (before transformers 5): text settings at
    the top level with rope_scaling {type: mrope}, weights named model.* and visual.*."""
    from safetensors.torch import load_file, save_file
    dst.mkdir()
    c = json.loads((src / "config.json").read_text())
    text, vision = c.pop("text_config"), c.pop("vision_config")
    rp = text.pop("rope_parameters")
    text.pop("model_type")
    vision["model_type"] = "qwen2_5_vl"      # as the old checkpoints (mis)label it
    vision["in_chans"] = vision.pop("in_channels")
    old = {**c, **text, "rope_theta": rp["rope_theta"], "vision_config": vision,
           "rope_scaling": {"type": "mrope", "mrope_section": rp["mrope_section"]}}
    (dst / "config.json").write_text(json.dumps(old))
    w = load_file(str(src / "model.safetensors"))
    ren = {k.replace("model.language_model.", "model.").replace("model.visual.", "visual."): v
           for k, v in w.items()}
    save_file(ren, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        (dst / f).write_bytes((src / f).read_bytes())


def test_old_checkpoint_layout_loads_the_same(tiny_dir, tmp_path):
    old = tmp_path / "old"
    _old_layout(tiny_dir, old)
    new_l, old_l = (registry.load(str(d), progress=False) for d in (tiny_dir, old))
    assert old_l.config == new_l.config
    assert set(old_l.weights) == set(new_l.weights)
    for k, v in new_l.weights.items():
        assert torch.equal(old_l.weights[k], v), k
    # The fixture itself is checked by transformers: it reads the old layout as the same model.
    from transformers import Qwen2_5_VLForConditionalGeneration as HF
    a, b = (HF.from_pretrained(str(d)).float().eval() for d in (tiny_dir, old))
    assert a.config.vision_config.in_channels == b.config.vision_config.in_channels == 3
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert list(b.config.text_config.rope_parameters["mrope_section"]) == [2, 3, 3]
    ra, rb = a.config.text_config.rope_parameters, b.config.text_config.rope_parameters
    assert rb["rope_theta"] == ra["rope_theta"]


def test_bfloat16_serving_path_runs_a_video_prompt(tiny_dir):
    """The default CPU path (bf16 activations, int8 decode weights) against float32 mimo,
    itself checked against transformers above: close logits, chunked through the video."""
    out = {}
    for dt in ("float32", "bfloat16"):
        llm = LLM(str(tiny_dir), dtype=dt, kv_cache_memory="4MiB", page_size=8, progress=False)
        vc, grid = llm.engine.model_config.vision, [2, 8, 12]
        ids = llm.tokenizer.encode("<|im_start|>user\n<|vision_start|>" + "<|video_pad|>" * 48
                                   + "<|vision_end|>What happens?<|im_end|>\n<|im_start|>assistant\n")
        px = torch.randn(2 * 8 * 12, vc.patch_dim, generator=torch.Generator().manual_seed(0))
        mmp = build_mm_prompt(ids, vc, video_embeds=[llm.engine.model.encode(px, [grid])],
                              video_grid_thw=[grid], second_per_grid_ts=[1.0])
        out[dt] = llm.engine.prompt_logits(ids, chunk=13, mm=mmp)
        llm.engine.check_integrity()
    torch.testing.assert_close(out["bfloat16"], out["float32"], atol=0.1, rtol=0)


def test_text_model_refuses_media(tiny_dir):
    from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

    from mimo import SamplingParams
    from mimo.engine.engine import RequestError
    llm = LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf()), dtype="float32",
              kv_cache_memory="4MiB", progress=False)
    mmp = MMPrompt(torch.zeros(3, 2, dtype=torch.int64), 0, torch.zeros(0, dtype=torch.int64),
                   torch.zeros(0, 0))
    with pytest.raises(RequestError, match="no images"):
        llm.engine.add_request([5, 6], SamplingParams(max_tokens=1), mm=mmp)


def test_prefix_cache_reuses_kv_only_for_the_same_media(tiny_dir):
    """Media hashes key the prefix cache: the same image (same key) in the same place reuses
    the prompt's KV; another image behind the same placeholder ids does not, and its output
    equals an uncached run."""
    from mimo import SamplingParams
    llm = LLM(str(tiny_dir), dtype="float32", kv_cache_memory="4MiB", page_size=8,
              progress=False)
    vc, model = llm.engine.model_config.vision, llm.engine.model
    grid = [1, 8, 8]
    n = grid[0] * grid[1] * grid[2] // 4
    ids = [vc.vision_start_token_id] + [vc.image_token_id] * n + [vc.vision_end_token_id]
    ids += list(range(100, 140))
    pixels = {k: torch.randn(64, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(s))
              for s, k in enumerate("ab")}

    def run(key, cache_key):
        mmp = build_mm_prompt(ids, vc, image_embeds=[model.encode(pixels[key], [grid])],
                              image_grid_thw=[grid])
        mmp.cache_key = cache_key
        seq = llm.engine.add_request(ids, SamplingParams(temperature=0, max_tokens=6,
                                                         ignore_eos=True), mm=mmp)
        while llm.engine.has_work():
            llm.engine.step()
        llm.engine.check_integrity()
        return seq

    uncached_b = run("b", None)
    first_a, again_a, other_b = run("a", "hash-a"), run("a", "hash-a"), run("b", "hash-b")
    assert uncached_b.cached_tokens == first_a.cached_tokens == 0
    assert again_a.cached_tokens == len(ids) - 1   # whole pages, then a partial page copied
    assert again_a.output_ids == first_a.output_ids
    assert other_b.cached_tokens == 0 and other_b.output_ids == uncached_b.output_ids
