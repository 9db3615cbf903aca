"""The MLA references (expanded prefill, absorbed decode) on a paged latent cache against
transformers' DeepseekV3Attention, and against each other."""

from __future__ import annotations

import torch
from troupe.kernels.mla_reference import mla_decode_absorbed, mla_prefill_expanded, write_latent

HEADS, NOPE, ROPE, V, LORA, BS = 4, 8, 4, 12, 16, 4


def _hf_attention():
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    cfg = transformers.DeepseekV3Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        vocab_size=64, kv_lora_rank=LORA, q_lora_rank=None, qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE, v_head_dim=V, rope_interleave=True,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = hf.DeepseekV3Attention(cfg, 0).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return hf, attn, hf.DeepseekV3RotaryEmbedding(cfg)


def test_expanded_and_absorbed_match_transformers() -> None:
    hf, attn, rotary = _hf_attention()
    num_tokens = 7
    x = torch.randn(1, num_tokens, 32, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(num_tokens)[None]
    cos, sin = rotary(x, positions)
    mask = torch.full((num_tokens, num_tokens), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected = attn(x, (cos, sin), mask)[0][0]  # [T, hidden], after o_proj
        # the projections and rotary as transformers runs them; attention is ours
        q = attn.q_proj(x).view(1, num_tokens, HEADS, NOPE + ROPE).transpose(1, 2)
        q_nope, q_rot = q.split([NOPE, ROPE], dim=-1)
        latent, k_rot = attn.kv_a_proj_with_mqa(x).split([LORA, ROPE], dim=-1)
        latent = attn.kv_a_layernorm(latent)
        q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q_rot, k_rot[:, None], cos, sin)
    q_nope, q_rot = q_nope[0].transpose(0, 1), q_rot[0].transpose(0, 1)  # [T, H, *]
    cache = torch.full((4, BS, LORA + ROPE), float("nan"))  # unwritten slots never read
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    slots = torch.tensor([int(table[0, p // BS]) * BS + p % BS for p in range(num_tokens)])
    write_latent(latent[0], k_rot[0, 0], cache, slots)
    w = attn.kv_b_proj.weight.detach()
    scale = attn.scaling

    def o_proj(out: torch.Tensor) -> torch.Tensor:
        return attn.o_proj(out.reshape(out.shape[0], HEADS * V)).detach()

    # prefill in two chunks: 5 tokens, then 2 more that see the first 5 from the cache
    first = mla_prefill_expanded(q_nope[:5], q_rot[:5], cache, table, torch.tensor([5]),
                                 torch.tensor([0, 5]), w, V, scale)  # fmt: skip
    second = mla_prefill_expanded(q_nope[5:], q_rot[5:], cache, table, torch.tensor([7]),
                                  torch.tensor([0, 2]), w, V, scale)  # fmt: skip
    torch.testing.assert_close(o_proj(torch.cat([first, second])), expected)
    # decode: the last token's query alone, absorbed into the latent space
    last = mla_decode_absorbed(q_nope[6:], q_rot[6:], cache, table, torch.tensor([7]), w, V, scale)
    torch.testing.assert_close(o_proj(last), expected[6:])
    torch.testing.assert_close(last, second[1:], rtol=1e-5, atol=1e-5)
