/**
 * Exec sessions' exits recorded as they happen: each API process long-polls every live sandbox host
 * for the exits it has seen (GET /exec-exits, see ExecExitsAnswer) and writes each into its session's
 * record (once per process, ExecLive.recordExit). A record then holds its exit when the command
 * ends, not when someone reads the session: the organisation's count of running sessions
 * (EXEC_SESSIONS_PER_ORG) is the store's count of records without one, and no start waits for the
 * hosts to be asked about sessions nobody read. Exits a follower missed (a host restart, more than a
 * host keeps, an API that was down) are still recorded the old way, when the session is read or the
 * count reaches the limit.
 */
import type { SandboxDeps } from '../deps';
import type { ExecLive } from './exec-live';

/** How long one poll waits at the host for an exit; how often the live hosts are listed again; the pause after a failed poll. */
const POLL_WAIT_MS = 20_000;
const HOSTS_EVERY_MS = 10_000;
const RETRY_MS = 2_000;

/** Starts following every live host's exits; `stop` ends the polls. */
export function followExecExits(deps: Pick<SandboxDeps, 'hosts' | 'logger'>, live: Pick<ExecLive, 'recordExit'>): { stop(): void } {
  const followers = new Map<string, AbortController>();
  let stopped = false;

  async function follow(hostId: string, client: Awaited<ReturnType<SandboxDeps['hosts']['liveHosts']>>[number]['client'], ac: AbortController) {
    let epoch: string | undefined;
    let after = 0;
    while (!ac.signal.aborted) {
      try {
        const r = await client.execExits({ epoch, after, waitMs: POLL_WAIT_MS, signal: ac.signal });
        epoch = r.epoch;
        after = r.seq;
        for (const e of r.exits) {
          // Agent sessions' commands are recorded by their own service (their records have other ids).
          if (e.sessionID.startsWith('es-')) await live.recordExit('exec', e.sessionID, e.exitCode, new Date(e.exitedAt), e.oomKilled);
        }
      } catch (err) {
        if (ac.signal.aborted) return;
        deps.logger.debug({ hostId, err: (err as Error).message }, 'exec exits: poll failed; retrying');
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, RETRY_MS);
          ac.signal.addEventListener('abort', () => (clearTimeout(t), resolve()), { once: true });
        });
      }
    }
  }

  async function refresh(): Promise<void> {
    if (stopped) return;
    let hosts: Awaited<ReturnType<SandboxDeps['hosts']['liveHosts']>>;
    try {
      hosts = await deps.hosts.liveHosts();
    } catch {
      return;
    }
    if (stopped) return;
    const ids = new Set(hosts.map((h) => h.hostId));
    for (const [id, ac] of followers) {
      if (!ids.has(id)) {
        ac.abort();
        followers.delete(id);
      }
    }
    for (const h of hosts) {
      if (followers.has(h.hostId)) continue;
      const ac = new AbortController();
      followers.set(h.hostId, ac);
      void follow(h.hostId, h.client, ac);
    }
  }

  void refresh();
  const timer = setInterval(() => void refresh(), HOSTS_EVERY_MS);
  timer.unref();
  return {
    stop() {
      stopped = true;
      clearInterval(timer);
      for (const ac of followers.values()) ac.abort();
      followers.clear();
    },
  };
}
