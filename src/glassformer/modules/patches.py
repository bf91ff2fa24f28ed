"""Images as token sequences: cut into square patches, each patch one vector.

Shapes: B batch, C channels, H × W pixels, P patch side, N = (H/P)·(W/P) patches, D d_model.

A patch is flattened in (channel, row, column) order and multiplied by one weight matrix
(D × C·P·P) plus a bias. That is exactly a ``Conv2d`` whose kernel and stride are both P,
which is how it is computed here; ``weight.reshape(D, -1)`` is the matrix. Patches are
numbered row by row (raster order), as the pixels of a picture are read.

Their positions: learned (``position.LearnedPositionalEmbedding``, one vector a patch) or the
paper's sinusoids in two dimensions (``SinusoidalGridEncoding``, here).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from glassformer.modules.position import sinusoidal_table, table_rows


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


class SinusoidalGridEncoding(nn.Module):
    """The paper's sinusoids in two dimensions, for patches on a grid (a ViT's positions).

    The first half of the features is the 1-D table (``sinusoidal_table``, D/2 wide) at the
    patch's row, the second half at its column, so patches in one row share half their
    code and neighbours are close. Patches are numbered row by row. Like the 1-D table it is
    a non-persistent buffer, recomputed, never saved.

    Args:
        d_model: D (a multiple of 4: sin and cos for rows and for columns).
        grid: (rows, columns) of patches.
    """

    pe: Tensor  # (rows·cols, D), a buffer

    def __init__(self, *, d_model: int, grid: tuple[int, int]) -> None:
        super().__init__()
        if d_model <= 0 or d_model % 4:
            raise ValueError(f"a 2-D sinusoidal grid needs d_model divisible by 4, got {d_model}")
        if len(grid) != 2 or min(grid) <= 0:
            raise ValueError(f"grid must be (rows, columns), both positive, got {grid!r}")
        self.grid, self.d_model = (grid[0], grid[1]), d_model
        self.max_len = grid[0] * grid[1]
        self.register_buffer("pe", grid_table(self.grid, d_model), persistent=False)

    def reset_buffers(self) -> None:
        """Compute the table again (see ``SinusoidalPositionalEncoding.reset_buffers``)."""
        self.pe = grid_table(self.grid, self.d_model)

    def forward(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """(B, N, D) patch vectors, in raster order → the same with their positions added."""
        return x + self.rows(x, start, positions)

    def rows(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """The codes ``forward`` adds: (N, D)."""
        return table_rows(self.pe, x, start, positions)


def grid_table(grid: tuple[int, int], d_model: int) -> Tensor:
    """(rows·cols, D): each patch's row code (D/2) then its column code (D/2), row by row."""
    rows, cols = grid
    row_code = sinusoidal_table(rows, d_model // 2)  # (rows, D/2)
    col_code = sinusoidal_table(cols, d_model // 2)  # (cols, D/2)
    return torch.cat(
        [
            row_code[:, None, :].expand(rows, cols, -1),  # (rows, cols, D/2)
            col_code[None, :, :].expand(rows, cols, -1),  # (rows, cols, D/2)
        ],
        dim=-1,
    ).reshape(rows * cols, d_model)  # (N, D)
