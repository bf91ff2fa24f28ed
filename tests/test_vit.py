"""The Vision Transformer: patches are a reshape and a linear map, the model is the plain
encoder on patch tokens, the class token is what it reads, checkpoints round-trip."""

import pytest
import torch
from torch import nn

from glassformer import PatchEmbedding, VisionTransformer, ViTConfig
from glassformer.interop.torch_nn import to_torch_nn


def small(**overrides) -> VisionTransformer:
    torch.manual_seed(0)
    values = dict(image_size=8, patch_size=2, num_classes=3, d_model=32, num_heads=4,
                  num_layers=2, d_ff=64, dropout=0.0)  # fmt: skip
    return VisionTransformer(ViTConfig(**{**values, **overrides})).eval()


def test_patch_embedding_equals_an_explicit_reshape_and_linear():
    torch.manual_seed(0)
    B, C, H, W, P, D = 2, 3, 8, 12, 4, 16
    embed = PatchEmbedding(image_size=(H, W), patch_size=P, channels=C, d_model=D)
    linear = nn.Linear(C * P * P, D)
    with torch.no_grad():
        linear.weight.copy_(embed.proj.weight.reshape(D, -1))
        linear.bias.copy_(embed.proj.bias)
    images = torch.rand(B, C, H, W)
    patches = images.reshape(B, C, H // P, P, W // P, P)  # (B, C, rows, P, cols, P)
    patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // P) * (W // P), C * P * P)
    torch.testing.assert_close(embed(images), linear(patches), atol=1e-6, rtol=0)


def test_patches_are_numbered_row_by_row():
    """Patch k covers rows (k // cols)·P .. and columns (k % cols)·P ..: a bright pixel in
    one patch changes that token only."""
    embed = PatchEmbedding(image_size=(4, 6), patch_size=2, channels=1, d_model=8)
    blank = torch.zeros(1, 1, 4, 6)
    lit = blank.clone()
    lit[0, 0, 3, 2] = 1.0  # patch row 1, patch column 1 → patch 1·3 + 1 = 4
    changed = (embed(lit) - embed(blank)).abs().sum(-1)[0]  # (N,)
    assert changed.nonzero().flatten().tolist() == [4]


@pytest.mark.parametrize("norm_first", [True, False])
def test_one_patch_per_pixel_without_class_token_is_the_plain_encoder(norm_first):
    """Patch 1, mean pooling: the ViT is torch.nn's TransformerEncoder (the same weights)
    on the flattened image's pixels, each mapped by one linear layer, plus positions."""
    model = small(patch_size=1, pooling="mean", norm_first=norm_first, image_size=(4, 5))
    c = model.config
    layer = nn.TransformerEncoderLayer(
        c.d_model, c.num_heads, c.d_ff, dropout=0.0, activation="gelu", batch_first=True,
        norm_first=norm_first,
    )  # fmt: skip
    reference = nn.TransformerEncoder(
        layer,
        c.num_layers,
        norm=nn.LayerNorm(c.d_model) if norm_first else None,
        enable_nested_tensor=False,
    ).eval()
    stack = {k: v for k, v in model.state_dict().items() if k.startswith(("blocks.", "ln_final."))}
    reference.load_state_dict(to_torch_nn(stack))
    pixel = nn.Linear(1, c.d_model)
    with torch.no_grad():
        pixel.weight.copy_(model.embed.proj.weight.reshape(c.d_model, 1))
        pixel.bias.copy_(model.embed.proj.bias)
    images = torch.rand(3, 1, 4, 5)
    tokens = pixel(images.flatten(1)[..., None])  # (B, 20, D): one token per pixel
    tokens = tokens + model.pos_embed.weight  # (B, 20, D)
    expected = model.head(reference(tokens).mean(dim=1))  # (B, classes)
    torch.testing.assert_close(model(images).logits, expected, atol=1e-5, rtol=0)


def test_cls_pooling_reads_the_class_token_at_position_zero():
    model = small()
    images = torch.rand(2, 1, 8, 8)
    out, cache = model.run_with_cache(images)
    final = cache["ln_final.hook_normalized"]  # (B, 1 + 16, D)
    assert final.shape == (2, 17, 32)
    torch.testing.assert_close(out.logits, model.head(final[:, 0]), atol=1e-6, rtol=0)
    # the class token enters as the learned vector, the same for every image
    first = cache["blocks.0.hook_resid_pre"][:, 0]  # (B, D)
    torch.testing.assert_close(first, model.cls_token[0].expand(2, -1))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_attention_weights_cover_every_token_and_change_no_logit(pooling):
    model = small(pooling=pooling)
    images = torch.rand(2, 1, 8, 8)
    out = model(images, need_weights=True)
    tokens = 16 + (pooling == "cls")
    assert len(out.encoder_attentions) == 2
    for w in out.encoder_attentions:
        assert w.shape == (2, 4, tokens, tokens)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, tokens))
    torch.testing.assert_close(out.logits, model(images).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_save_and_from_pretrained_give_the_same_logits(tmp_path, positional):
    model = small(positional=positional, image_size=(8, 6), channels=3)
    model.save_pretrained(tmp_path / "vit")
    loaded = VisionTransformer.from_pretrained(tmp_path / "vit").eval()
    assert loaded.config == model.config
    images = torch.rand(2, 3, 8, 6)
    torch.testing.assert_close(loaded(images).logits, model(images).logits, atol=0, rtol=0)


def test_sinusoidal_positions_follow_the_patch_grid():
    model = small(positional="sinusoidal", image_size=(4, 6))
    pe = model.pos_embed.pe  # (rows·cols, D) = (2·3, 32)
    assert pe.shape == (6, 32)
    half = 16
    # patches in one row share the row half; patches in one column share the column half
    assert torch.equal(pe[3, :half], pe[5, :half]) and not torch.equal(pe[0, :half], pe[3, :half])
    assert torch.equal(pe[1, half:], pe[4, half:]) and not torch.equal(pe[1, half:], pe[2, half:])


def test_loss_is_the_cross_entropy_of_the_logits():
    model = small()
    images, labels = torch.rand(4, 1, 8, 8), torch.tensor([0, 2, 1, 2])
    out = model(images, labels=labels)
    torch.testing.assert_close(out.loss, nn.functional.cross_entropy(out.logits, labels))


def test_a_small_vit_learns_a_fixed_batch():
    model = small().train()
    torch.manual_seed(1)
    images, labels = torch.rand(8, 1, 8, 8), torch.randint(0, 3, (8,))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        loss = model(images, labels=labels).loss
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(image_size=8, patch_size=3), "patch_size 3 must divide the image size 8×8"),
        (dict(patch_size=0), "patch_size must be a positive integer, got 0"),
        (dict(pooling="max"), "pooling must be one of ['cls', 'mean'], got 'max'"),
        (dict(positional="sinusoidal", d_model=6, num_heads=2), "divisible by 4, got 6"),
        (dict(channels=0), "channels must be a positive integer, got 0"),
    ],
)
def test_bad_configs_are_refused_with_the_value(overrides, message):
    with pytest.raises(ValueError) as e:
        small(**overrides)
    assert message in str(e.value)


def test_images_of_the_wrong_shape_are_refused_with_both_shapes():
    with pytest.raises(ValueError, match=r"= \(B, 1, 8, 8\), got \(2, 3, 8, 8\)"):
        small()(torch.rand(2, 3, 8, 8))


def test_presets_build():
    for name in ("tiny", "small", "base"):
        config = ViTConfig.preset(name, image_size=8, num_classes=10)
        assert VisionTransformer(config)(torch.rand(1, 1, 8, 8)).logits.shape == (1, 10)
