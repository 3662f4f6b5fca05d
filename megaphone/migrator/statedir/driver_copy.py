"""The driver's durable copy: its state directory's files kept under the checkpoint location.

With a checkpoint location the driver writes what it alone holds (manifest, routing, commit
records with their metrics, kept outputs) under ``CHECKPOINT/driver/`` too, so a driver whose
disk is lost restarts on any host from the checkpoint alone. Writing a commit file is the
commit point, before the state directory's own ``commit.json``. Layout and order:
docs/worker-store.md, "The driver's copy"; the names come from :mod:`megaphone.paths`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from megaphone.errors import MegaphoneError
from megaphone.paths import (
    COMMIT_RECORD_SUFFIX,
    COMMITS,
    FOLDED_METRICS,
    FOLDED_METRICS_SUFFIX,
    MANIFEST,
    OUTPUTS,
    ROUTING,
    checkpoint_driver_root,
    outputs_epoch_of,
    seq_name,
    seq_of,
)
from megaphone.state_backends.durable import _sync_if_local, filesystem

#: Commit files kept; older ones are folded into a metrics file and deleted, in steps of
#: :data:`FOLD_COMMITS` (as Spark keeps its last 100 batches' offsets and commits).
KEEP_COMMITS = 100
FOLD_COMMITS = 50
#: Folded metrics files kept (the oldest is deleted when a fold makes one more): with the
#: commit files, the copy holds the metrics of the last 350 to 400 epochs, so its size stays
#: flat however long the pipeline runs.
KEEP_FOLDS = 5


class DriverCopyError(MegaphoneError, ValueError):
    """A checkpoint's driver copy that is corrupt, or does not fit the state directory."""


class Files:
    """Whole files under ``root`` on ``fs`` (``pyarrow.fs``: local, or a checkpoint location's
    store), at ``uri``: each written aside and renamed, so readers never see a torn one."""

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str) -> None:
        self.fs, self.root, self.uri = fs, root, uri
        self._folders: set[str] = set()  # folders known to exist

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def put(self, data: bytes, *parts: str) -> None:
        """Write the file ``parts`` whole (``"inbox", "x.plan.json"``)."""
        path = self._path(*parts)
        folder = path.rsplit("/", 1)[0]
        if folder not in self._folders:
            self.fs.create_dir(folder, recursive=True)
            self._folders.add(folder)
        tmp = f"{path}.tmp"
        with self.fs.open_output_stream(tmp) as sink:
            sink.write(data)
        _sync_if_local(self.fs, tmp)
        self.fs.move(tmp, path)  # readers never see a torn file (on S3 a copy: still whole)

    def read(self, *parts: str) -> bytes:
        """The bytes of the file ``parts`` (``"outputs", "e000000007.arrow"``)."""
        path = self._path(*parts)
        try:
            with self.fs.open_input_stream(path) as src:
                return src.read()
        except (FileNotFoundError, OSError) as exc:
            raise DriverCopyError(f"file {path} under {self.uri} is unreadable: {exc}") from None

    def names(self, folder: str) -> list[str]:
        """The names of the files in ``folder``, sorted (none if it is missing)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self._path(folder), allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def delete(self, *parts: str) -> None:
        """Delete the file ``parts`` if it is there."""
        path = self._path(*parts)
        if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
            self.fs.delete_file(path)


class DriverCopy(Files):
    """The driver's files under ``CHECKPOINT/driver/``."""

    def __init__(self, uri: str) -> None:
        fs, root = filesystem(uri)
        super().__init__(fs, checkpoint_driver_root(root), uri)
        self._routing: bytes | None = None  # the routing table's bytes last written here
        #: Epochs' metrics for the next commit file (recorded after their commit point: a driver
        #: lost before the next commit loses those lines, not the epochs).
        self.pending_metrics: list[dict[str, Any]] = []
        self._commits: list[int] | None = None  # commit files present (listed once)
        self._folded_left: list[int] = []  # commit files a lost driver folded, not deleted

    # -- writing -----------------------------------------------------------------------------

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Keep the state directory's manifest."""
        self.put(json.dumps(manifest).encode(), MANIFEST)

    def write_commit(self, commit: dict[str, Any], routing_file: Path) -> None:
        """Write commit file ``commit["seq"]``: the commit point. The routing table (read from
        the state directory, where the epoch saved it) goes first if it changed since."""
        routing = routing_file.read_bytes()
        if routing != self._routing:
            self.put(routing, ROUTING)
            self._routing = routing
        record = {"commit": commit, "metrics": self.pending_metrics}
        commits = self._listed_commits()  # listed before this file is there: held once
        self.put(json.dumps(record, separators=(",", ":")).encode(),
                 COMMITS, seq_name(commit["seq"], COMMIT_RECORD_SUFFIX))
        self.pending_metrics = []
        if commit["seq"] not in commits:
            commits.append(commit["seq"])
        for seq in self._folded_left:
            self.fs.delete_file(self._path(COMMITS, seq_name(seq, COMMIT_RECORD_SUFFIX)))
        self._folded_left = []
        if len(commits) >= KEEP_COMMITS + FOLD_COMMITS:
            self._fold(commits[:FOLD_COMMITS])
            del commits[:FOLD_COMMITS]

    def _listed_commits(self) -> list[int]:
        """The commit files present (listed once). Commit files already folded into a
        metrics file (a driver lost between a fold and its deletes) are left out, so their
        metrics are never read twice; the next :meth:`write_commit` deletes them."""
        if self._commits is None:
            folded = self._list(FOLDED_METRICS, FOLDED_METRICS_SUFFIX)
            upto = folded[-1] if folded else -1
            listed = self._list(COMMITS, COMMIT_RECORD_SUFFIX)
            self._folded_left = [s for s in listed if s <= upto]
            self._commits = [s for s in listed if s > upto]
        return self._commits

    def _fold(self, seqs: list[int]) -> None:
        lines = [json.dumps(m, separators=(",", ":")) + "\n"
                 for seq in seqs for m in self._commit_file(seq)[1]]
        self.put("".join(lines).encode(), FOLDED_METRICS, seq_name(seqs[-1], FOLDED_METRICS_SUFFIX))
        for seq in seqs:
            self.fs.delete_file(self._path(COMMITS, seq_name(seq, COMMIT_RECORD_SUFFIX)))
        for seq in self._list(FOLDED_METRICS, FOLDED_METRICS_SUFFIX)[:-KEEP_FOLDS]:
            self.fs.delete_file(self._path(FOLDED_METRICS, seq_name(seq, FOLDED_METRICS_SUFFIX)))

    # -- reading -----------------------------------------------------------------------------

    def _list(self, folder: str, suffix: str) -> list[int]:
        return sorted(s for n in self.names(folder) if (s := seq_of(n, suffix)) is not None)

    def _json(self, *parts: str) -> Any:
        try:
            return json.loads(self.read(*parts))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DriverCopyError(f"driver copy file {'/'.join(parts)} under {self.uri} is "
                                  f"corrupt: {exc}") from None

    def _commit_file(self, seq: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        record = self._json(COMMITS, seq_name(seq, COMMIT_RECORD_SUFFIX))
        if not isinstance(record, dict) or not isinstance(record.get("commit"), dict) \
                or record["commit"].get("seq") != seq or not isinstance(record.get("metrics"),
                                                                        list):
            raise DriverCopyError(f"driver copy commit file {seq} under {self.uri} is malformed")
        return record["commit"], record["metrics"]

    def manifest(self) -> dict[str, Any] | None:
        """The kept manifest, or ``None`` when this checkpoint holds no driver copy yet."""
        if not self._listed_commits():
            return None
        manifest = self._json(MANIFEST)
        if not isinstance(manifest, dict):
            raise DriverCopyError(f"driver copy manifest under {self.uri} is malformed")
        return manifest

    def latest_commit(self) -> dict[str, Any]:
        """The commit record of the last commit point."""
        return self._commit_file(self._listed_commits()[-1])[0]

    def metrics(self) -> list[dict[str, Any]]:
        """Every kept metrics record, in order (folded files, then commit files)."""
        records: list[dict[str, Any]] = []
        for seq in self._list(FOLDED_METRICS, FOLDED_METRICS_SUFFIX):
            data = self.read(FOLDED_METRICS, seq_name(seq, FOLDED_METRICS_SUFFIX))
            records += [json.loads(line) for line in data.decode().splitlines()]
        for seq in self._listed_commits():
            records += self._commit_file(seq)[1]
        return records

    def output_epochs(self) -> list[int]:
        """The epochs whose outputs are kept here."""
        return sorted(e for n in self.names(OUTPUTS) if (e := outputs_epoch_of(n)) is not None)
