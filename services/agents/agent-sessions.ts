/**
 * Sandbox agent sessions: an agent runner started inside the sandbox as an exec session, speaking
 * JSON lines (see sandbox/runners/agent.ts). Clients attach with the exec WebSocket at
 * /api/sandboxes/{id}/exec/{as-…}. The runner is /opt/sap/agent.cjs, which the API writes into the
 * sandbox: by default it runs the Claude Agent SDK; AGENT_RUNNER (a JSON argv array, or a command
 * line split on spaces) or the request's `runner` runs another program through it instead.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { notFound } from '../../contract/errors';
import { randomId } from '../../lib/ids';
import type { HostClient } from '../../sandbox';
import type { ExecSessionInfo } from '../../sandbox';
import { AgentSessionDoc, findAgentSession, insertAgentSession, listSandboxAgentSessions, updateSession } from '../../store/exec';
import { type ExecLive, killAndWait, liveExec, liveFields, signalName } from '../exec/exec-live';
import { fromHostError } from '../hosts/host-errors';
import type { SandboxDeps } from '../deps';

/** Where the runner is written in the sandbox. */
export const RUNNER_PATH = '/opt/sap/agent.cjs';
/** Where runners' config and state files go in the sandbox. */
export const STATE_DIR = '/opt/sap/state';

/** The public form of an agent session. */
export interface AgentSessionState {
  sessionID: string;
  sandboxID: string;
  running: boolean;
  startedAt: string;
  agentSessionID: string;
  exitCode: number | null;
  exitedAt: string | null;
}

/** AGENT_RUNNER as argv: a JSON array of strings, or a command line split on white space. */
export function parseRunnerSetting(value: string | undefined): string[] | undefined {
  const v = value?.trim();
  if (!v) return undefined;
  if (v.startsWith('[')) {
    const parsed = z.array(z.string()).min(1).safeParse(JSON.parse(v));
    if (!parsed.success) throw new Error('AGENT_RUNNER: must be a JSON array of strings or a command line');
    return parsed.data;
  }
  return v.split(/\s+/);
}

let runnerSource: Buffer | undefined;
/** The compiled runner (dist/sandbox/runners/agent.js), read once. */
export function runnerFile(): Buffer {
  runnerSource ??= readFileSync(path.join(__dirname, '..', '..', 'sandbox', 'runners', 'agent.js'));
  return runnerSource;
}

async function readAgentSessionId(host: HostClient, doc: AgentSessionDoc): Promise<string> {
  try {
    const buf = await host.readFile(doc.sandboxId, doc.stateFile, { maxBytes: 4096 });
    if (!buf) return '';
    const id = (JSON.parse(buf.toString('utf8')) as { agentSessionID?: unknown }).agentSessionID;
    return typeof id === 'string' ? id : '';
  } catch {
    return '';
  }
}

/** The agent session operations of the API, over the live-session registry. */
export function createAgentSessionService(deps: SandboxDeps, live: ExecLive) {
  const defaultRunner = parseRunnerSetting(process.env.AGENT_RUNNER);

  /** The public view, with the live fields from the host and the agent SDK's session id once known. */
  async function agentView(host: HostClient, doc: AgentSessionDoc, info: ExecSessionInfo | null): Promise<AgentSessionState> {
    let agentSessionID = doc.agentSessionID;
    if (!agentSessionID) {
      agentSessionID = await readAgentSessionId(host, doc);
      if (agentSessionID) {
        updateSession(deps.store, 'agent', doc._id, { agentSessionID }).catch((err: unknown) =>
          deps.logger.warn({ err, id: doc._id }, 'could not record agentSessionID'),
        );
      }
    }
    live.noteExit('agent', doc._id, info, doc);
    const l = liveFields(info, doc);
    return {
      sessionID: doc._id,
      sandboxID: doc.sandboxId,
      running: l.running,
      startedAt: doc.startedAt.toISOString(),
      agentSessionID,
      exitCode: l.exitCode,
      exitedAt: l.exitedAt,
    };
  }

  async function orgAgent(orgId: string, sandboxId: string, id: string): Promise<AgentSessionDoc> {
    const doc = await findAgentSession(deps.store, id);
    if (!doc || doc.orgId !== orgId || doc.sandboxId !== sandboxId) throw notFound(`agent session ${id}`);
    return doc;
  }

  return {
    /** Writes the runner and its options into the sandbox and starts it; records the session. */
    async start(orgId: string, sandboxId: string, body: { runner?: string[]; cwd?: string } & Record<string, unknown>): Promise<AgentSessionState> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const id = `as-${randomId()}`;
      const { runner, ...options } = body;
      const argv = runner ?? defaultRunner;
      const configFile = `${STATE_DIR}/${id}.config.json`;
      const stateFile = `${STATE_DIR}/${id}.json`;
      let info: ExecSessionInfo;
      try {
        // One after the other: the host's parent-directory creation is not safe against a concurrent write.
        await host.writeFile(sandboxId, RUNNER_PATH, runnerFile(), { mode: 0o755 });
        await host.writeFile(sandboxId, configFile, JSON.stringify(options), { mode: 0o600 });
        info = await host.createExec(sandboxId, {
          cmd: 'node',
          args: [RUNNER_PATH, '--config', configFile, '--state', stateFile, ...(argv ? ['--', ...argv] : [])],
          cwd: body.cwd,
        });
      } catch (err) {
        throw fromHostError(err, `sandbox ${sandboxId}`);
      }
      const doc: AgentSessionDoc = {
        _id: id,
        orgId,
        sandboxId,
        execId: info.sessionID,
        stateFile,
        options: JSON.stringify(options),
        agentSessionID: '',
        startedAt: new Date(info.startedAt),
        exitedAt: null,
        exitCode: null,
      };
      try {
        await insertAgentSession(deps.store, doc);
      } catch (err) {
        await host.killExec(sandboxId, info.sessionID).catch(() => undefined);
        throw err;
      }
      live.rememberTarget(id, { orgId, sandboxId, execId: info.sessionID, kind: 'agent' });
      const l = liveFields(info, doc);
      return {
        sessionID: id,
        sandboxID: sandboxId,
        running: l.running,
        startedAt: doc.startedAt.toISOString(),
        agentSessionID: '',
        exitCode: l.exitCode,
        exitedAt: l.exitedAt,
      };
    },

    /** The sandbox's agent sessions, newest first, with their live state. */
    async list(orgId: string, sandboxId: string): Promise<AgentSessionState[]> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const rows = await live.listWithLive(host, orgId, sandboxId, 'agent', listSandboxAgentSessions(deps.store, sandboxId), (d) => d.execId);
      return Promise.all(rows.map(({ doc, info }) => agentView(host, doc, info)));
    },

    /** An agent session with its live state. */
    async get(orgId: string, sandboxId: string, id: string): Promise<AgentSessionState> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const doc = await orgAgent(orgId, sandboxId, id);
      return agentView(host, doc, await liveExec(host, sandboxId, doc.execId));
    },

    /** Signals an agent session's runner (default SIGKILL) and answers once it exited (or after 2 s). */
    async kill(orgId: string, sandboxId: string, id: string, signal: string | number | undefined): Promise<AgentSessionState> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const doc = await orgAgent(orgId, sandboxId, id);
      const info = await killAndWait(host, sandboxId, doc.execId, signalName(signal));
      return agentView(host, doc, info);
    },
  };
}

/** The agent session operations (see createAgentSessionService). */
export type AgentSessionService = ReturnType<typeof createAgentSessionService>;
