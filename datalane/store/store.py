"""The checkpoint store: lane states in object storage with an atomic, verifiable commit.

:class:`CheckpointStore` is the library both the sidecar and the operator call:

* a sidecar writes its pod's lane states of a step (:meth:`~CheckpointStore.write_pod`) and
  then tries :meth:`~CheckpointStore.commit`; the last pod to arrive completes the step;
* a restoring sidecar :meth:`~CheckpointStore.load`\\ s the lanes its ranks now own;
* the operator lists :meth:`~CheckpointStore.committed_steps`, reports
  :meth:`~CheckpointStore.latest_committed` and garbage-collects with
  :meth:`~CheckpointStore.gc`; ``datalane audit`` prints :meth:`~CheckpointStore.audit`.

A step is committed iff ``steps/<step>/MANIFEST.json`` exists and verifies: its bytes are
what :func:`~datalane.store.manifest.build_manifest` derives from the pod objects it lists,
each object's bytes hash to the listed SHA-256, and each lane state hashes to its listed
SHA-256. A manifest is written only after every lane ``0..L-1`` was found exactly once in the
step's pod objects, each object read back and hashed, and their fingerprints agree; so a
crash, a fault or a race can leave a step uncommitted but never committed and broken.
Corrupt or truncated objects are refused with a StorageError naming the object.

Committing is idempotent and safe to race: any writer may call ``commit(step)``, and since
the manifest is a deterministic function of the pod objects and the previous manifest,
racers write identical bytes.

Imports only datalane.spec, fsspec and the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec

from datalane.spec.errors import ConfigError, MismatchError, StorageError
from datalane.spec.state import Checkpoint, LaneState, merge_checkpoints
from datalane.store.amendments import check_consumed_prefix, same_consumed_prefix
from datalane.store.audit import AuditReport, ManifestRecord, audit_records
from datalane.store.history import History, gc_record, head_record, read_gc_record, read_head
from datalane.store.layout import (
    basename,
    check_step,
    format_steps,
    gc_path,
    gc_root,
    head_path,
    is_pod_object_name,
    manifest_path,
    pod_object_name,
    pod_path,
    signature_path,
    step_dir,
    step_of_dir,
    steps_root,
)
from datalane.store.manifest import Manifest, PodRead, build_manifest, missing_lanes
from datalane.store.objects import FileSystem, ObjectIO
from datalane.store.podstate import PodObject, lane_sha256, sha256_hex
from datalane.store.signing import (
    check_key,
    key_id,
    ledger_key_from_env,
    sign_manifest,
    signature_problem,
)

__all__ = ["CheckpointStore", "NoCheckpointError"]

log = logging.getLogger("datalane.store")


class NoCheckpointError(ConfigError, LookupError):
    """A restore asked for a step that has no committed checkpoint in the store."""


@dataclass
class _StepFiles:
    """What one listing found in a step directory."""

    has_manifest: bool = False
    pods: list[str] = field(default_factory=list)  # pod object names


class CheckpointStore:
    """Checkpoints of one training run under one base URI.

    ``uri`` is any fsspec URI (``file:///ckpt``, a plain local path, ``s3://bucket/run``);
    ``storage_options`` go to fsspec unchanged (for s3fs: ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``). ``retries`` is how many times a transient
    failure of one object operation is retried (with exponential backoff starting at
    ``backoff`` seconds) before it is raised as ``StorageError(transient=True)``.
    ``filesystem`` replaces the filesystem fsspec would build for ``uri`` (tests wrap the
    real one to inject faults); paths are still taken from ``uri``. ``ledger_key`` signs
    every manifest this store commits (HMAC-SHA256, :mod:`datalane.store.signing`); None
    takes it from ``$DATALANE_LEDGER_KEY_FILE`` or ``$DATALANE_LEDGER_KEY``, and without
    either the store does not sign.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, Any] | None = None,
                 retries: int = 3, *, backoff: float = 0.2,
                 filesystem: FileSystem | None = None,
                 ledger_key: bytes | None = None) -> None:
        try:
            fs, path = fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
        except (ValueError, ImportError) as e:
            raise ConfigError(f"cannot open checkpoint store {uri!r}: {e}") from e
        base = str(path).rstrip("/")
        self.uri: str = str(fs.unstrip_protocol(base)).rstrip("/")
        """The store's base URI, normalised (``file:///abs/path`` for local paths)."""
        self._base = base
        self._io = ObjectIO(filesystem if filesystem is not None else fs, base, self.uri,
                            retries=retries, backoff=backoff)
        self._verified: set[int] = set()  # committed steps gc has verified (immutable once so)
        self._key = (ledger_key_from_env() if ledger_key is None
                     else check_key(ledger_key, "ledger_key"))

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri!r})"

    # ----------------------------------------------------------------------------- writing

    def write_pod(self, step: int, pod_id: str | int, lanes: Mapping[int, LaneState],
                  digests: Mapping[int, Mapping[int, bytes | str]], fingerprint: str,
                  fingerprint_doc: dict[str, Any] | None, lanes_total: int) -> str:
        """Write pod ``pod_id``'s lane states of ``step`` atomically; returns the object URI.

        ``digests`` maps each step the pod served since the previous committed checkpoint to
        ``{lane: window digest}`` (32 bytes or hex); they become the manifest's ledger. If
        ``step`` is already committed nothing is written: the given lane states must equal
        the committed ones (MismatchError otherwise, a sign of a nondeterministic stream or a
        changed recipe; a recipe that only appended phases starting at or after ``step`` is
        the same run) and the manifest's URI is returned.
        """
        check_step(step)
        pod_object_name(pod_id)  # validates the id (not its str: True is no pod) before any read
        pod = str(pod_id)
        obj = PodObject.build(step, pod, lanes, digests, fingerprint, fingerprint_doc,
                              lanes_total)
        mpath = manifest_path(self._base, step)
        committed = self._parsed_manifest(step)
        if committed is not None:
            self._check_against_committed(obj, committed)
            log.info("step %d is already committed in %s; pod %s's lanes match, not rewritten",
                     step, self.uri, pod)
            return self._io.uri(mpath)
        path = pod_path(self._base, step, pod)
        self._io.write(path, obj.encode())
        return self._io.uri(path)

    def _check_against_committed(self, obj: PodObject, manifest: Manifest) -> None:
        where = self._io.uri(manifest_path(self._base, obj.step))
        same_run = same_consumed_prefix(obj.fingerprint, obj.fingerprint_doc,
                                        manifest.fingerprint, manifest.fingerprint_doc, obj.step)
        if not same_run or obj.lanes_total != manifest.lanes_total:
            raise MismatchError(
                f"step {obj.step} is already committed in {where} with fingerprint "
                f"{manifest.fingerprint[:16]}... and {manifest.lanes_total} lanes; pod "
                f"{obj.pod} brings fingerprint {obj.fingerprint[:16]}... and "
                f"{obj.lanes_total} lanes")
        differ = [lane for lane in sorted(obj.lanes)
                  if manifest.lanes[lane].sha256 != lane_sha256(obj.lane_json[lane])]
        if differ:
            raise MismatchError(
                f"step {obj.step} is already committed in {where}, and pod {obj.pod}'s states "
                f"of lanes {differ} differ from the committed ones: the stream is not "
                f"deterministic for this recipe")

    def commit(self, step: int) -> Manifest | None:
        """Commit ``step`` if every lane is present; returns its manifest, None if incomplete.

        Idempotent: a step already committed is verified and its manifest returned; a
        manifest that cannot even be parsed is derived again from the pod objects. Raises
        MismatchError when the step's objects disagree (fingerprint, lane count) or hold two
        different states of a lane (the same state twice, from a stale object of an earlier
        topology, is harmless), StorageError when an object is corrupt or cannot be read.
        """
        check_step(step)
        mpath = manifest_path(self._base, step)
        existing = self._io.read_optional(mpath)
        if existing is not None and self._parsed_manifest(step, existing) is not None:
            verified = self._verify(step, existing)[0]
            self._advance_head(step, existing, verified.seq)  # a commit cut before HEAD.json
            return verified
        names = self._scan(step_dir(self._base, step)).get(step, _StepFiles()).pods
        reads = [self._read_pod(step, name) for name in names]
        previous = self._previous(step)
        # the chain counts from the first manifest, or from the first one of a datalane that
        # counts (an older datalane's manifest carries no seq)
        seq = 0 if previous is None or previous[2] is None else previous[2] + 1
        manifest = build_manifest(step, reads, previous[:2] if previous else None, seq)
        if manifest is None:
            missing = missing_lanes(reads)
            log.info("step %d not committed yet: %d pod objects, lanes %s missing", step,
                     len(reads), _ranges(missing) if reads else "all")
            return None
        data = manifest.encode()
        if self._key is not None:  # first: a manifest is never visible unsigned
            self._io.write(signature_path(self._base, step), sign_manifest(self._key, step, data))
        self._io.write(mpath, data)
        self._advance_head(step, data, manifest.seq)
        log.info("committed step %d in %s (%d lanes in %d objects, %d ledger entries)", step,
                 self.uri, manifest.lanes_total, len(manifest.objects), len(manifest.ledger))
        return manifest

    def _advance_head(self, step: int, data: bytes, seq: int | None) -> None:
        """Point ``HEAD.json`` at committed ``step`` (manifest bytes ``data``) unless it names
        a newer step already; racing committers write the same bytes."""
        path = head_path(self._base)
        current = self._io.read_optional(path)
        if current is not None:
            head, _ = read_head(current, self._io.uri(path), None)
            if head is not None and head.step > step:
                return
        new = head_record(self._key, step, sha256_hex(data), seq)
        if current != new:
            self._io.write(path, new)

    def _parsed_manifest(self, step: int, data: bytes | None = None) -> Manifest | None:
        """The manifest of ``step`` if one exists and parses; None if absent or unparseable.

        An unparseable manifest (a PUT that stored a truncated body) records nothing a reader
        could use: writers treat the step as uncommitted and commit derives it again.
        """
        mpath = manifest_path(self._base, step)
        data = self._io.read_optional(mpath) if data is None else data
        if data is None:
            return None
        try:
            return Manifest.decode(data, self._io.uri(mpath))
        except StorageError as e:
            log.warning("the manifest of step %d is unreadable and will be rebuilt: %s", step, e)
            return None

    def discard(self, step: int) -> None:
        """Delete the pod objects of an uncommitted step (e.g. left by an older topology)."""
        check_step(step)
        if self._io.read_optional(manifest_path(self._base, step)) is not None:
            raise ConfigError(f"step {step} is committed in {self.uri}; only uncommitted steps "
                              f"can be discarded (committed ones go with gc)")
        self._io.delete_tree(step_dir(self._base, step))

    # ----------------------------------------------------------------------------- reading

    def committed_steps(self, verify: bool = False) -> list[int]:
        """Ascending steps that have a manifest; with ``verify``, only those that verify."""
        steps = sorted(s for s, f in self._scan().items() if f.has_manifest)
        if verify:
            steps = [s for s in steps if self._verifies(s)]
        return steps

    def is_committed(self, step: int) -> bool:
        """Whether ``step`` has a manifest that parses (one read; nothing verified)."""
        check_step(step)
        return self._parsed_manifest(step) is not None

    def pod_uri(self, step: int, pod_id: str | int) -> str:
        """The URI of pod ``pod_id``'s object of ``step`` (what an error names)."""
        return self._io.uri(pod_path(self._base, check_step(step), pod_id))

    def latest_committed(self, verify: bool = False) -> int | None:
        """The newest committed step (the newest that verifies, with ``verify``), or None."""
        for step in reversed(self.committed_steps()):
            if not verify or self._verifies(step):
                return step
        return None

    def manifest(self, step: int) -> Manifest:
        """The verified manifest of ``step`` (reads and checks every object of the step)."""
        check_step(step)
        return self._verify(step, self._read_manifest(step))[0]

    def load(self, step: int, lanes: Iterable[int] | None = None, *,
             fingerprint: str | None = None,
             fingerprint_doc: dict[str, Any] | None = None) -> Checkpoint:
        """The lane states of committed ``step``, every object verified by its SHA-256.

        ``lanes`` restricts the restore to some lanes (a pod's share after a re-deal): only
        the objects holding them are read. A store with a ledger key restores only a manifest
        its signature vouches for (StorageError naming ``MANIFEST.sig`` otherwise). With
        ``fingerprint``, a checkpoint of another recipe is refused with a MismatchError naming
        the fields that differ; a recipe that only appended (or changed) phases starting at or
        after ``step`` is the same run.
        """
        check_step(step)
        data = self._read_manifest(step)
        if self._key is not None:  # a store that signs restores only what it signed
            self._check_signature(step, data)
        wanted = None if lanes is None else sorted(set(lanes))
        manifest, reads = self._verify(step, data, wanted)
        if fingerprint is not None:
            check_consumed_prefix(manifest.fingerprint, manifest.fingerprint_doc, fingerprint,
                                  fingerprint_doc or {}, step,
                                  f"checkpoint step {step} in {self.uri}")
        chosen = range(manifest.lanes_total) if wanted is None else wanted
        parts = []
        for read in reads.values():
            own = {lane: read.pod.lanes[lane] for lane in chosen
                   if manifest.lanes[lane].object == read.name}
            parts.append(Checkpoint(step, manifest.fingerprint, manifest.fingerprint_doc, own,
                                    manifest.lanes_total))
        if not parts:
            return Checkpoint(step, manifest.fingerprint, manifest.fingerprint_doc, {},
                              manifest.lanes_total)
        return merge_checkpoints(parts)

    def _check_signature(self, step: int, data: bytes) -> None:
        """StorageError naming the signature object when it does not vouch for the manifest
        bytes ``data`` of ``step`` under this store's ledger key."""
        assert self._key is not None
        spath = signature_path(self._base, step)
        problem = signature_problem(self._key, step, data, self._io.read_optional(spath),
                                    self._io.uri(spath))
        if problem is not None:
            raise StorageError(f"checkpoint step {step} in {self.uri} will not be restored "
                               f"with ledger key {key_id(self._key)}: {problem}",
                               transient=False)

    def _read_manifest(self, step: int) -> bytes:
        data = self._io.read_optional(manifest_path(self._base, step))
        if data is not None:
            return data
        scan = self._scan()
        committed = sorted(s for s, f in scan.items() if f.has_manifest)
        hint = ""
        if scan.get(step, _StepFiles()).pods:
            hint = (f" (it has {len(scan[step].pods)} pod objects but was never committed: "
                    f"some lanes are missing)")
        raise NoCheckpointError(f"step {step} has no committed checkpoint in {self.uri}{hint}; "
                                f"committed steps: {format_steps(committed)}")

    def _read_pod(self, step: int, name: str) -> PodRead:
        path = f"{step_dir(self._base, step)}/{name}"
        uri = self._io.uri(path)
        data = self._io.read(path)
        return PodRead(name, uri, data, PodObject.decode(data, uri))

    def _verify(self, step: int, data: bytes, lanes: list[int] | None = None,
                ) -> tuple[Manifest, dict[str, PodRead]]:
        """Check a manifest against its objects; with ``lanes``, only the objects holding them.

        Returns the manifest and the pod objects read. Raises StorageError naming the object
        (or the manifest) that does not verify.
        """
        muri = self._io.uri(manifest_path(self._base, step))
        manifest = Manifest.decode(data, muri)
        if manifest.step != step or (manifest.previous_step is not None
                                     and manifest.previous_step >= step):
            raise StorageError(f"corrupt manifest {muri}: it names step {manifest.step} and "
                               f"previous step {manifest.previous_step}", transient=False)
        for lane in lanes or ():
            if not 0 <= lane < manifest.lanes_total:
                raise ConfigError(f"lane {lane} is outside 0..{manifest.lanes_total - 1} of the "
                                  f"checkpoint of step {step} in {self.uri}")
        names = sorted(manifest.objects) if lanes is None else manifest.objects_for(lanes)
        reads: dict[str, PodRead] = {}
        for name in names:
            read = self._read_pod_listed(step, name, manifest.objects[name], muri)
            reads[name] = read
        for lane in range(manifest.lanes_total) if lanes is None else lanes:
            entry = manifest.lanes[lane]
            pod = reads[entry.object]
            if lane not in pod.pod.lane_json:
                raise StorageError(f"{pod.uri} does not hold lane {lane}, although {muri} "
                                   f"lists it there; the checkpoint will not be used",
                                   transient=False)
            if pod.pod.fingerprint != manifest.fingerprint:
                raise StorageError(f"{pod.uri} has fingerprint {pod.pod.fingerprint[:16]}..., "
                                   f"but {muri} lists {manifest.fingerprint[:16]}...; the "
                                   f"checkpoint will not be used", transient=False)
            if lane_sha256(pod.pod.lane_json[lane]) != entry.sha256:
                raise StorageError(f"lane {lane} in {pod.uri} does not match the SHA-256 that "
                                   f"{muri} lists for it; the checkpoint will not be used",
                                   transient=False)
        if lanes is None:
            prev = (None if manifest.previous_step is None or manifest.previous_sha256 is None
                    else (manifest.previous_step, manifest.previous_sha256))
            rebuilt = build_manifest(step, list(reads.values()), prev, manifest.seq)
            if rebuilt is None or rebuilt.encode() != data:
                fields = _differing_fields(manifest, rebuilt)
                raise StorageError(f"manifest {muri} does not match the pod objects it lists "
                                   f"(differs in: {fields}); it was altered after commit and "
                                   f"will not be used", transient=False)
        return manifest, reads

    def _read_pod_listed(self, step: int, name: str, sha: str, muri: str) -> PodRead:
        path = f"{step_dir(self._base, step)}/{name}"
        uri = self._io.uri(path)
        data = self._io.read_optional(path)
        if data is None:
            raise StorageError(f"{uri} is listed in {muri} but does not exist; the checkpoint "
                               f"of step {step} is incomplete and will not be used",
                               transient=False)
        if sha256_hex(data) != sha:
            raise StorageError(
                f"corrupt object {uri}: its {len(data)} bytes hash to "
                f"{sha256_hex(data)[:16]}..., but {muri} lists {sha[:16]}...; the object is "
                f"truncated or altered and will not be used", transient=False)
        return PodRead(name, uri, data, PodObject.decode(data, uri))

    def _verifies(self, step: int) -> bool:
        try:
            self._verify(step, self._read_manifest(step))
        except (StorageError, MismatchError, NoCheckpointError) as e:
            if isinstance(e, StorageError) and e.transient:
                raise
            log.warning("checkpoint step %d in %s does not verify: %s", step, self.uri, e)
            return False
        return True

    def _previous(self, step: int) -> tuple[int, str, int | None] | None:
        """(step, sha256 of its manifest bytes, its seq) of the newest manifest below ``step``.

        Manifests that cannot be parsed are skipped: they are rebuilt when their step is
        committed again, and a link to their broken bytes would then dangle.
        """
        for prev in reversed([s for s in self.committed_steps() if s < step]):
            data = self._io.read_optional(manifest_path(self._base, prev))
            parsed = self._parsed_manifest(prev, data) if data is not None else None
            if data is not None and parsed is not None:
                return prev, sha256_hex(data), parsed.seq
        return None

    def _scan(self, prefix: str | None = None) -> dict[int, _StepFiles]:
        """One listing of the step directories under ``prefix`` (default: all of them)."""
        root = steps_root(self._base)
        steps: dict[int, _StepFiles] = {}
        for path in self._io.list_files(prefix or root):
            rel = path[len(root) + 1:] if path.startswith(root + "/") else ""
            parts = rel.split("/")
            step = step_of_dir(parts[0]) if len(parts) == 2 else None
            if step is None:
                continue
            files = steps.setdefault(step, _StepFiles())
            name = basename(path)
            if name == "MANIFEST.json":
                files.has_manifest = True
            elif is_pod_object_name(name):
                files.pods.append(name)
        return steps

    # ----------------------------------------------------------------------- housekeeping

    def gc(self, keep: int) -> list[int]:
        """Keep the newest ``keep`` committed steps, and the newest one that verifies if those
        do not; delete older committed steps and every uncommitted step older than the newest
        committed one. Returns the deleted steps.

        A committed step loses its manifest first, so readers never see it half deleted.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"gc keeps at least the newest checkpoint: keep must be >= 1, "
                              f"got {keep!r}")
        scan = self._scan()
        committed = sorted(s for s, f in scan.items() if f.has_manifest)
        if not committed:
            return []
        kept = set(committed[-keep:])
        # never delete the newest checkpoint that verifies: if the newest ones are corrupt it
        # is the one a restore falls back to. Checked only when something would be deleted
        # (reading the newest step's objects, once per step and store instance).
        if any(s not in kept and s < committed[-1] for s in scan):
            for step in reversed(committed):
                if step in self._verified or self._verifies(step):
                    self._verified.add(step)
                    kept.add(step)
                    break
        doomed = sorted(s for s in scan if s not in kept and s < committed[-1])
        removed = [s for s in doomed if scan[s].has_manifest]
        if removed:  # first: the audit tells this collection from a deletion by hand
            self._record_gc(removed, sorted(kept))
        for step in doomed:
            if scan[step].has_manifest:
                self._io.delete(manifest_path(self._base, step))
            self._io.delete_tree(step_dir(self._base, step))
        if doomed:
            log.info("gc of %s: kept steps %s, deleted steps %s", self.uri,
                     format_steps(sorted(kept)), format_steps(doomed))
        return doomed

    def _record_gc(self, steps: list[int], kept: list[int]) -> None:
        """Write the gc record of the committed ``steps`` about to be removed.

        A record of the same name (an earlier collection that died after deleting some of
        its steps, and listed this one too) keeps its other entries in the new record, those
        this store's key vouches for: the steps it already deleted stay accounted for.
        """
        entries = []
        for step in steps:
            data = self._io.read_optional(manifest_path(self._base, step))
            if data is not None:
                entries.append((step, sha256_hex(data), self._parsed_manifest(step, data)))
        if entries:
            path = gc_path(self._base, steps[-1])
            earlier = self._io.read_optional(path)
            carried = ([] if earlier is None
                       else read_gc_record(earlier, self._io.uri(path), self._key)[0])
            self._io.write(path, gc_record(self._key, entries, kept, carried))

    def _history(self, key: bytes | None) -> History:
        """HEAD.json and the gc records, their signatures checked with ``key`` (if given)."""
        hpath = head_path(self._base)
        history = History(self._io.uri(hpath))
        data = self._io.read_optional(hpath)
        if data is not None:
            history.head, history.head_problem = read_head(data, history.head_uri, key)
        for path in self._io.list_files(gc_root(self._base)):
            if not path.endswith(".json"):
                continue
            uri = self._io.uri(path)
            record = self._io.read_optional(path)
            removed, problem = read_gc_record(record or b"", uri, key)
            if problem is not None:
                history.problems.append(f"gc record {problem}; the steps it lists as removed "
                                        f"are not accounted for")
            for entry in removed:
                history.removed.setdefault(entry.step, entry)
        return history

    def audit(self, key: bytes | None = None) -> AuditReport:
        """Verify every committed checkpoint, the hash chain and the ledger's continuity.

        With ``key`` (a ledger key), every manifest must also carry a valid HMAC signature
        made with it; an unsigned or forged one is a problem of its step. A store with no
        object at all is a problem too (a wrong URI must not audit as "OK").
        """
        if key is not None:
            check_key(key, "the audit's key")
        scan = self._scan()
        if not scan and not self._io.list_files(self._base):
            return audit_records(self.uri, [], [], missing=(
                f"there is no checkpoint store at {self.uri}: nothing is stored under it "
                f"(check the URI, and the bucket and prefix)"))
        records = []
        for step in sorted(s for s, f in scan.items() if f.has_manifest):
            uri = self._io.uri(manifest_path(self._base, step))
            data = self._io.read_optional(manifest_path(self._base, step))
            if data is None:
                continue  # deleted since the listing (a concurrent gc)
            manifest: Manifest | None = None
            problem = None
            try:
                manifest = self._verify(step, data)[0]
            except (StorageError, MismatchError) as e:
                if isinstance(e, StorageError) and e.transient:
                    raise
                problem = str(e)
                try:
                    manifest = Manifest.decode(data, uri)
                except (StorageError, MismatchError):
                    manifest = None
            signature = None
            if key is not None:
                spath = signature_path(self._base, step)
                signature = signature_problem(key, step, data, self._io.read_optional(spath),
                                              self._io.uri(spath))
            records.append(ManifestRecord(step, uri, sha256_hex(data), manifest, problem,
                                          signature))
        uncommitted = sorted(s for s, f in scan.items() if not f.has_manifest)
        return audit_records(self.uri, records, uncommitted,
                             key_id=key_id(key) if key is not None else None,
                             history=self._history(key))


def _ranges(lanes: list[int]) -> str:
    out: list[str] = []
    for lane in lanes:
        if out and out[-1].split("-")[-1] == str(lane - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{lane}"
        else:
            out.append(str(lane))
    return ", ".join(out)


def _differing_fields(stored: Manifest, rebuilt: Manifest | None) -> str:
    """The top-level keys in which a stored manifest differs from the one its objects give;
    an optional key (``phases``, ``seq``) present in only one of them is such a key."""
    if rebuilt is None:
        return "lanes (its objects do not hold every lane)"
    a, b = stored.to_json(), rebuilt.to_json()
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    return ", ".join(keys) if keys else "encoding"
