/**
 * What exec sessions and agent sessions share: the sandbox's host (its owner cached, its use
 * recorded), the host's live state of a session merged with its record (an exit the host reports is
 * written once), killing and waiting, and where a WebSocket attach goes. Agent sessions (as-…) are
 * exec sessions of the runner, recorded in their own collection.
 */
import { constants as osConstants } from 'node:os';
import { ApiError, notFound } from '../../contract/errors';
import type { HostClient } from '../../sandbox';
import type { ExecSessionInfo } from '../../sandbox';
import { findAgentSession, findExec, updateSession, type SessionKind } from '../../store/exec';
import { findOrgSandbox } from '../../store/sandboxes';
import { fromHostError } from '../hosts/host-errors';
import type { SandboxDeps } from '../deps';
import type { SandboxService } from '../sandboxes/sandboxes';

/** What a session's record holds of its end. */
export interface ExitRecord {
  exitCode: number | null;
  exitedAt: Date | null;
  oomKilled?: boolean;
}

/** The live fields of a session as callers see them. */
export interface LiveFields {
  running: boolean;
  exitCode: number | null;
  exitedAt: string | null;
  attachedClients: number;
  oomKilled?: boolean;
}

/** What a WebSocket attaches to; immutable, so cached. */
export interface AttachTarget {
  orgId: string;
  sandboxId: string;
  execId: string;
  kind: SessionKind;
}

/** The host's live state of an exec session; null once the host no longer knows it. */
export async function liveExec(host: HostClient, sandboxId: string, execId: string): Promise<ExecSessionInfo | null> {
  try {
    return await host.getExec(sandboxId, execId);
  } catch (err) {
    if ((err as { name?: string; status?: number }).name === 'HostError' && (err as { status: number }).status === 404) return null;
    throw fromHostError(err, `exec session ${execId}`);
  }
}

/** The host's live exec sessions of a sandbox by id; empty when the host no longer knows the sandbox. */
export async function liveExecsOf(host: HostClient, sandboxId: string): Promise<Map<string, ExecSessionInfo>> {
  const live = await host.listExec(sandboxId).catch((err: unknown) => {
    if ((err as { status?: number }).status === 404) return [] as ExecSessionInfo[];
    throw fromHostError(err, `sandbox ${sandboxId}`);
  });
  return new Map(live.map((i) => [i.sessionID, i]));
}

/** Live fields of a session from the host's answer, or from the record when the host forgot it. */
export function liveFields(info: ExecSessionInfo | null, rec: ExitRecord): LiveFields {
  if (info) {
    const oomKilled = info.oomKilled ?? rec.oomKilled;
    return {
      running: info.running,
      exitCode: info.exitCode,
      exitedAt: info.exitedAt ?? (info.running ? null : (rec.exitedAt?.toISOString() ?? null)),
      attachedClients: info.attachedClients,
      ...(oomKilled !== undefined ? { oomKilled } : {}),
    };
  }
  return {
    running: false,
    exitCode: rec.exitCode,
    exitedAt: rec.exitedAt?.toISOString() ?? null,
    attachedClients: 0,
    ...(rec.oomKilled !== undefined ? { oomKilled: rec.oomKilled } : {}),
  };
}

/** A signal name the host accepts (SIGTERM), from a name with or without SIG, or a number; 400 for an unknown one. */
export function signalName(signal: string | number | undefined): string | undefined {
  if (signal === undefined) return undefined;
  const table = osConstants.signals as Record<string, number>;
  if (typeof signal === 'number') {
    const name = Object.keys(table).find((k) => table[k] === signal);
    if (!name) throw new ApiError('invalid_request', `body.signal: unknown signal ${signal}`);
    return name;
  }
  const name = signal.toUpperCase().startsWith('SIG') ? signal.toUpperCase() : `SIG${signal.toUpperCase()}`;
  if (!(name in table)) throw new ApiError('invalid_request', `body.signal: unknown signal ${signal}`);
  return name;
}

/** Signals an exec session, then waits up to 2 s for it to exit; returns the host's last answer. */
export async function killAndWait(host: HostClient, sandboxId: string, execId: string, signal: string | undefined): Promise<ExecSessionInfo | null> {
  let info: ExecSessionInfo | null;
  try {
    info = await host.killExec(sandboxId, execId, signal);
  } catch (err) {
    if ((err as { status?: number }).status === 404) return null;
    throw fromHostError(err, `exec session ${execId}`);
  }
  const deadline = Date.now() + 2000;
  while (info?.running && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    info = await liveExec(host, sandboxId, execId);
  }
  return info;
}

/** How many times an exit is written to a record not there yet, and how far apart (see recordOnce). */
const RECORD_RETRIES = 20;
const RECORD_RETRY_MS = 250;

/**
 * The live-session registry of an API process: attach targets (immutable, so cached; a sandbox's
 * owner and host come from the sandbox service's cache), and which exits were recorded already.
 */
export function createExecLive(deps: SandboxDeps, sandboxes: SandboxService) {
  const targets = new Map<string, AttachTarget>();
  const recordedExits = new Set<string>();
  const recordedOom = new Set<string>();

  /**
   * Sets `fields` in a session's record once per session per process (`seen` remembers which; a failed
   * write is forgotten so that the next look retries).
   */
  async function recordOnce(kind: SessionKind, id: string, seen: Set<string>, fields: Record<string, unknown>, attempt = 1): Promise<void> {
    if (seen.has(id)) return;
    if (seen.size > 100_000) seen.clear();
    seen.add(id);
    try {
      if (await updateSession(deps.store, kind, id, fields)) return;
      // No record yet: a start writes it while its host starts the command, and a command that ends
      // at once can be reported first. Tried again a few times (RECORD_RETRY_MS apart) before it is
      // left to the session's next read.
      seen.delete(id);
      if (attempt < RECORD_RETRIES) {
        setTimeout(() => void recordOnce(kind, id, seen, fields, attempt + 1), RECORD_RETRY_MS).unref();
      }
    } catch (err) {
      seen.delete(id);
      deps.logger.warn({ err, id }, 'could not record an exec exit');
    }
  }

  /** Stores an exit (and oomKilled when known) in the record, once per session per process. */
  function recordExit(kind: SessionKind, id: string, exitCode: number | null, exitedAt: Date, oomKilled?: boolean): Promise<void> {
    return recordOnce(kind, id, recordedExits, { exitedAt, exitCode, ...(oomKilled !== undefined ? { oomKilled } : {}) });
  }

  /**
   * Persists an exit the host reports (or the host's loss of the session) if the record lacks it; and
   * the host's oomKilled when the exit was recorded without it (from the WebSocket's exit frame).
   */
  function noteExit(kind: SessionKind, id: string, info: ExecSessionInfo | null, rec: { exitedAt: Date | null; oomKilled?: boolean }): void {
    if (info && info.running) return;
    if (rec.exitedAt) {
      if (info?.oomKilled !== undefined && rec.oomKilled === undefined) void recordOnce(kind, id, recordedOom, { oomKilled: info.oomKilled });
      return;
    }
    const at = info?.exitedAt ? new Date(info.exitedAt) : new Date();
    void recordExit(kind, id, info ? info.exitCode : null, at, info?.oomKilled);
  }

  /**
   * The organisation's sandbox's host client, or 404 (another organisation's sandbox is 404).
   * Marks the sandbox used (resets its idle timeout) without waiting for the write.
   */
  async function sandboxHost(orgId: string, sandboxId: string): Promise<HostClient> {
    let owner = sandboxes.ownerOf(sandboxId);
    if (!owner) {
      const doc = await findOrgSandbox(deps.store, orgId, sandboxId);
      if (!doc) throw notFound(`sandbox ${sandboxId}`);
      owner = { orgId: doc.orgId, hostId: doc.hostId };
      sandboxes.rememberOwner(doc);
    }
    if (owner.orgId !== orgId) throw notFound(`sandbox ${sandboxId}`);
    sandboxes.touch(sandboxId);
    return deps.hosts.get(owner.hostId);
  }

  /**
   * A sandbox's sessions of one kind, each with the host's live state (keyed by its exec id), exits
   * the host reports recorded. One listing for exec sessions and agent sessions.
   */
  async function listWithLive<D extends ExitRecord & { _id: string; orgId: string }>(
    host: HostClient,
    orgId: string,
    sandboxId: string,
    kind: SessionKind,
    records: Promise<D[]>,
    execIdOf: (d: D) => string,
  ): Promise<{ doc: D; info: ExecSessionInfo | null }[]> {
    const [docs, byId] = await Promise.all([records, liveExecsOf(host, sandboxId)]);
    return docs
      .filter((d) => d.orgId === orgId)
      .map((d) => {
        const info = byId.get(execIdOf(d)) ?? null;
        noteExit(kind, d._id, info, d);
        return { doc: d, info };
      });
  }

  /** Caches where a session id attaches (called on creation, so a first attach needs no lookup). */
  function rememberTarget(sessionID: string, t: AttachTarget): void {
    if (targets.size > 10_000) targets.clear();
    targets.set(sessionID, t);
  }

  /** Where a session id (es-… or as-…) attaches, or null when there is no such session. */
  async function attachTarget(sessionID: string): Promise<(AttachTarget & { exitCode: number | null }) | null> {
    const hit = targets.get(sessionID);
    if (hit) return { ...hit, exitCode: null };
    let t: (AttachTarget & { exitCode: number | null }) | null = null;
    if (sessionID.startsWith('es-')) {
      const d = await findExec(deps.store, sessionID);
      if (d) t = { orgId: d.orgId, sandboxId: d.sandboxId, execId: d._id, kind: 'exec', exitCode: d.exitCode };
    } else {
      const d = await findAgentSession(deps.store, sessionID);
      if (d) t = { orgId: d.orgId, sandboxId: d.sandboxId, execId: d.execId, kind: 'agent', exitCode: d.exitCode };
    }
    if (t) rememberTarget(sessionID, { orgId: t.orgId, sandboxId: t.sandboxId, execId: t.execId, kind: t.kind });
    return t;
  }

  return { sandboxHost, recordExit, noteExit, listWithLive, rememberTarget, attachTarget, touch: sandboxes.touch };
}

/** The live-session registry (see createExecLive). */
export type ExecLive = ReturnType<typeof createExecLive>;
