"""The identity of a pipeline's keyed state, checked wherever state, routing or plans meet."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from megaphone.errors import MegaphoneError
from megaphone.routing.bins import validate_num_bins
from megaphone.routing.keys import check_key_type


class FingerprintMismatch(MegaphoneError, ValueError):
    """Raised when state, a routing table or a plan belongs to another pipeline."""


@dataclass(frozen=True)
class Fingerprint:
    """Pipeline id, bin count and key type: two things with equal fingerprints share bins.

    A routing table, a state directory and a migration plan all carry one, so a plan made for
    one pipeline can never be applied to another by mistake.
    """

    pipeline_id: str
    num_bins: int
    key_type: str

    def __post_init__(self) -> None:
        if not isinstance(self.pipeline_id, str) or not self.pipeline_id:
            raise ValueError(f"pipeline_id must be a non-empty string, got {self.pipeline_id!r}")
        validate_num_bins(self.num_bins)
        check_key_type(self.key_type)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as stored in routing tables, manifests and plans."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Fingerprint:
        """Parse the JSON form; anything malformed is a clear ``ValueError``."""
        if not isinstance(data, dict) or set(data) != {"pipeline_id", "num_bins", "key_type"}:
            raise ValueError(
                "fingerprint must be an object with exactly pipeline_id, num_bins and key_type, "
                f"got {data!r}"
            )
        if isinstance(data["num_bins"], bool) or not isinstance(data["num_bins"], int):
            raise ValueError(f"fingerprint num_bins must be an integer, got {data['num_bins']!r}")
        return cls(data["pipeline_id"], data["num_bins"], data["key_type"])

    def check(self, other: Fingerprint, what: str = "this") -> None:
        """Raise :class:`FingerprintMismatch` naming every field where ``other`` differs."""
        diffs = [
            f"{name} is {getattr(other, name)!r}, expected {getattr(self, name)!r}"
            for name in ("pipeline_id", "num_bins", "key_type")
            if getattr(self, name) != getattr(other, name)
        ]
        if diffs:
            raise FingerprintMismatch(f"{what} belongs to another pipeline: " + "; ".join(diffs))
