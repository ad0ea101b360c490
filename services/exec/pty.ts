/**
 * Terminals (the OpenComputer client's `sandbox.pty`): a login shell on a pseudo-terminal of the
 * sandbox, kept by its host (see sandbox/host/pty.ts), recorded in MongoDB so that any API process
 * can attach a client.
 */
import { notFound } from '../../contract/errors';
import type { HostClient } from '../../sandbox';
import { findPty, insertPty } from '../../store/pty';
import type { ExecLive } from './exec-live';
import { fromHostError } from '../hosts/host-errors';
import type { SandboxDeps } from '../deps';

/** The terminal operations of the API. */
export function createPtyService(deps: SandboxDeps, live: ExecLive) {
  return {
    /** Starts a login shell on a pseudo-terminal of the sandbox and records it. */
    async start(orgId: string, sandboxId: string, body: { cols: number; rows: number; envs?: Record<string, string>; cwd?: string }) {
      const host = await live.sandboxHost(orgId, sandboxId);
      let info;
      try {
        info = await host.createPty(sandboxId, body);
      } catch (err) {
        throw fromHostError(err, `sandbox ${sandboxId}`);
      }
      await insertPty(deps.store, { _id: info.sessionID, orgId, sandboxId, createdAt: new Date() });
      return info;
    },

    /** The host of the organisation's terminal `sessionID` of sandbox `sandboxId` (404 otherwise), to attach to. */
    async hostOf(orgId: string, sandboxId: string, sessionID: string): Promise<HostClient> {
      const doc = await findPty(deps.store, sessionID);
      if (!doc || doc.orgId !== orgId || doc.sandboxId !== sandboxId) throw notFound(`terminal ${sessionID}`);
      return live.sandboxHost(orgId, sandboxId);
    },
  };
}

/** The terminal operations (see createPtyService). */
export type PtyService = ReturnType<typeof createPtyService>;
