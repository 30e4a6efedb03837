"""Write a tiny Cu/Ag training and validation set in DeePMD-kit's npy format.

Eight atoms (four Cu, four Ag) sit on a randomly perturbed fcc lattice in a
periodic orthorhombic box (a 1x1x2 supercell of the conventional fcc cell).
Energies and forces come from a Morse pair potential with the Girifalco-Weizer
parameters for Cu and Ag, arithmetic means for the Cu-Ag pair, and a
shifted-force cutoff so that both energy and force go smoothly to zero at the
cutoff. Every periodic image within the cutoff is summed, so the labels are
exactly what a model with the same cutoff can see.

Usage::

    python examples/make_data.py [--out DIR] [--frames N] [--seed S]

writes ``DIR/train`` (``N`` frames) and ``DIR/valid`` (``max(2, N // 4)``
frames), each holding ``type.raw``, ``type_map.raw`` and
``set.000/{coord,box,energy,force}.npy``. Only numpy is needed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TYPE_MAP = ("Cu", "Ag")
"""Element names; the index of a name is its atom type."""

MORSE = {
    # type pair: (well depth D [eV], stiffness a [1/Angstrom], distance r0 [Angstrom])
    (0, 0): (0.3429, 1.3588, 2.866),
    (1, 1): (0.3323, 1.3690, 3.115),
    (0, 1): (0.3376, 1.3639, 2.9905),
}
"""Morse parameters per unordered type pair (Girifalco and Weizer, 1959)."""

CUTOFF = 5.0
"""Cutoff radius of the pair potential in Angstrom."""

LATTICE = 4.25
"""Edge of the conventional fcc cell in Angstrom.

Close to the energy minimum of the truncated potential, so forces stay moderate.
"""

FCC_BASIS = np.array(
    [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]
)
"""Fractional positions of the four atoms of a conventional fcc cell."""


def reference_structure() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Build the unperturbed eight-atom structure.

    Returns
    -------
    positions : np.ndarray
        Cartesian positions, shape ``(8, 3)``, in Angstrom.
    types : np.ndarray
        Atom types, shape ``(8,)``: the lower cell is Cu, the upper one Ag.
    cell : np.ndarray
        Edge lengths of the orthorhombic box, shape ``(3,)``, in Angstrom.
    """
    cell = LATTICE * np.array([1.0, 1.0, 2.0])
    upper_cell = np.array([0.0, 0.0, 1.0])
    fractional = np.concatenate([FCC_BASIS, FCC_BASIS + upper_cell])
    positions = fractional * LATTICE
    types = np.array([0] * 4 + [1] * 4)
    return positions, types, cell


def pair_parameters(types: np.ndarray) -> tuple[np.ndarray, ...]:
    """Look up the Morse parameters of every ordered atom pair.

    Parameters
    ----------
    types : np.ndarray
        Atom types, shape ``(natoms,)``.

    Returns
    -------
    depth, stiffness, distance : np.ndarray
        ``D``, ``a`` and ``r0`` of each pair, each of shape ``(natoms, natoms)``.
    """
    table = np.empty((len(TYPE_MAP), len(TYPE_MAP), 3))
    for (ti, tj), params in MORSE.items():
        table[ti, tj] = table[tj, ti] = params
    pairs = table[types[:, None], types[None, :]]
    return pairs[..., 0], pairs[..., 1], pairs[..., 2]


def morse(
    r: np.ndarray, depth: np.ndarray, stiffness: np.ndarray, distance: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate the Morse potential and its radial derivative.

    Parameters
    ----------
    r : np.ndarray
        Pair distances.
    depth, stiffness, distance : np.ndarray
        ``D``, ``a`` and ``r0``, broadcastable against ``r``.

    Returns
    -------
    energy : np.ndarray
        ``D * (exp(-2 a (r - r0)) - 2 exp(-a (r - r0)))``.
    derivative : np.ndarray
        ``dE/dr``.
    """
    decay = np.exp(-stiffness * (r - distance))
    energy = depth * (decay**2 - 2.0 * decay)
    derivative = 2.0 * stiffness * depth * (decay - decay**2)
    return energy, derivative


def energy_and_forces(
    positions: np.ndarray, types: np.ndarray, cell: np.ndarray
) -> tuple[float, np.ndarray]:
    """Compute the periodic shifted-force Morse energy and the atomic forces.

    The pair term is ``V(r) - V(rc) - (r - rc) V'(rc)`` below the cutoff
    ``rc`` and zero beyond it. Every periodic image closer than the cutoff
    contributes, so the box may be smaller than twice the cutoff.

    Parameters
    ----------
    positions : np.ndarray
        Cartesian positions, shape ``(natoms, 3)``.
    types : np.ndarray
        Atom types, shape ``(natoms,)``.
    cell : np.ndarray
        Edge lengths of the orthorhombic box, shape ``(3,)``.

    Returns
    -------
    energy : float
        Total potential energy in eV.
    forces : np.ndarray
        Forces ``-dE/dx`` in eV/Angstrom, shape ``(natoms, 3)``.
    """
    reach = np.ceil(CUTOFF / cell).astype(int)
    ranges = [np.arange(-n, n + 1) for n in reach]
    shifts = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1).reshape(-1, 3)
    shifts = shifts * cell
    # separation[i, j, s] = x_j + shift_s - x_i
    separation = (
        positions[None, :, None, :] - positions[:, None, None, :] + shifts[None, None]
    )
    r = np.linalg.norm(separation, axis=-1)
    inside = (r < CUTOFF) & (r > 1e-8)
    r_safe = np.where(inside, r, CUTOFF)

    depth, stiffness, distance = (p[:, :, None] for p in pair_parameters(types))
    v, dv = morse(r_safe, depth, stiffness, distance)
    v_cut, dv_cut = morse(np.float64(CUTOFF), depth, stiffness, distance)
    pair_energy = np.where(inside, v - v_cut - (r_safe - CUTOFF) * dv_cut, 0.0)
    pair_slope = np.where(inside, dv - dv_cut, 0.0)

    # Each pair appears twice in the double sum over (i, j).
    energy = 0.5 * float(pair_energy.sum())
    forces = np.einsum("ijs,ijsk->ik", pair_slope / r_safe, separation)
    return energy, forces


def sample_frames(n_frames: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Draw perturbed structures and label them.

    Each frame scales the box isotropically by up to 3 % and displaces every
    atom by a Gaussian of 0.1 Angstrom per component.

    Parameters
    ----------
    n_frames : int
        Number of frames to draw.
    rng : np.random.Generator
        Source of randomness.

    Returns
    -------
    dict[str, np.ndarray]
        ``coord`` ``(n_frames, 3 natoms)``, ``box`` ``(n_frames, 9)``,
        ``energy`` ``(n_frames,)``, ``force`` ``(n_frames, 3 natoms)`` and
        ``type`` ``(natoms,)``.
    """
    positions0, types, cell0 = reference_structure()
    coords, boxes, energies, forces = [], [], [], []
    for _ in range(n_frames):
        scale = 1.0 + rng.uniform(-0.03, 0.03)
        cell = cell0 * scale
        positions = positions0 * scale + rng.normal(0.0, 0.1, positions0.shape)
        positions = np.mod(positions, cell)
        energy, force = energy_and_forces(positions, types, cell)
        coords.append(positions.reshape(-1))
        boxes.append(np.diag(cell).reshape(-1))
        energies.append(energy)
        forces.append(force.reshape(-1))
    return {
        "coord": np.array(coords),
        "box": np.array(boxes),
        "energy": np.array(energies),
        "force": np.array(forces),
        "type": types,
    }


def write_system(directory: Path, frames: dict[str, np.ndarray]) -> None:
    """Write one system in DeePMD-kit's npy layout.

    Parameters
    ----------
    directory : Path
        System directory; created if missing, existing files are overwritten.
    frames : dict[str, np.ndarray]
        Output of :func:`sample_frames`.
    """
    set_dir = directory / "set.000"
    set_dir.mkdir(parents=True, exist_ok=True)
    np.savetxt(directory / "type.raw", frames["type"], fmt="%d")
    (directory / "type_map.raw").write_text("\n".join(TYPE_MAP) + "\n")
    for key in ("coord", "box", "energy", "force"):
        np.save(set_dir / f"{key}.npy", frames[key])


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and write the training and validation systems.

    Parameters
    ----------
    argv : list[str], optional
        Command-line arguments; ``sys.argv[1:]`` when omitted.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data", help="output directory")
    parser.add_argument(
        "--frames", type=int, default=40, help="number of training frames"
    )
    parser.add_argument("--seed", type=int, default=20240607, help="random seed")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error("--frames must be at least 1")

    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    write_system(out / "train", sample_frames(args.frames, rng))
    write_system(out / "valid", sample_frames(max(2, args.frames // 4), rng))
    print(f"wrote {out / 'train'} and {out / 'valid'}")


if __name__ == "__main__":
    main()
