"""Images as token sequences: cut into square patches, each patch one vector.

Shapes: B batch, C channels, H × W pixels, P patch side, N = (H/P)·(W/P) patches, D d_model.

A patch is flattened in (channel, row, column) order and multiplied by one weight matrix
(D × C·P·P) plus a bias. That is exactly a ``Conv2d`` whose kernel and stride are both P,
which is how it is computed here; ``weight.reshape(D, -1)`` is the matrix. Patches are
numbered row by row (raster order), as the pixels of a picture are read.
"""

from __future__ import annotations

from torch import Tensor, nn


class PatchEmbedding(nn.Module):
    """Cut images into P × P patches and project each to D: (B, C, H, W) → (B, N, D).

    Args:
        image_size: (H, W) the images must have; each a multiple of ``patch_size``.
        patch_size: P.
        channels: C (1 for grey, 3 for RGB).
        d_model: D.
    """

    def __init__(
        self, *, image_size: tuple[int, int], patch_size: int, channels: int, d_model: int
    ) -> None:
        super().__init__()
        check_patches(image_size, patch_size)
        self.image_size, self.patch_size, self.channels = tuple(image_size), patch_size, channels
        self.grid = (image_size[0] // patch_size, image_size[1] // patch_size)  # patch rows, cols
        self.proj = nn.Conv2d(channels, d_model, kernel_size=patch_size, stride=patch_size)

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) → patch vectors (B, N, D), patches in raster order."""
        expected = (self.channels, *self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            want = "(B, " + ", ".join(map(str, expected)) + ")"
            raise ValueError(
                f"images must be (batch, channels, height, width) = {want}, "
                f"got {tuple(images.shape)}"
            )
        x = self.proj(images)  # (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2)  # (B, N, D)


def check_patches(image_size: tuple[int, ...], patch_size: int) -> None:
    """Patches must tile the image exactly."""
    if not isinstance(patch_size, int) or isinstance(patch_size, bool) or patch_size <= 0:
        raise ValueError(f"patch_size must be a positive integer, got {patch_size!r}")
    if len(image_size) != 2 or any(not isinstance(s, int) or s <= 0 for s in image_size):
        raise ValueError(f"image_size must be (height, width) in pixels, got {image_size!r}")
    if image_size[0] % patch_size or image_size[1] % patch_size:
        raise ValueError(
            f"patch_size {patch_size} must divide the image size {image_size[0]}×{image_size[1]}"
        )
