/**
 * One turn of a conversation, run in its sandbox (the worker's activities call these; the
 * conversation workflow orders them). A turn starts the runner (sandbox/runners/agent.ts, the one
 * `POST /api/sandboxes/{id}/agent` uses) as an exec session, sends it the message as a `prompt`
 * line, stores every line it prints as an event with the next sequence number, and ends at its
 * `turn_complete`: the runner's stdin is then closed and it exits. The agent's memory (the Claude
 * Agent SDK's `/root/.claude`, the runner's state file with the SDK's session id) stays in the
 * sandbox's files, so the next turn, or a fork's, resumes from the checkpoint alone.
 */
import type { HostClient } from '../../sandbox';
import { decodeExecFrame, encodeStdinFrame } from '../../sandbox';
import { CONVERSATION_BOUNDS, eventLevel, type RunnerOptions, type TurnOutcome, type YieldReason } from '../../contract/conversations';
import { turnCheckpointId } from '../../contract/checkpoints';
import type { Store } from '../../store';
import { insertCheckpoint, type CheckpointDoc } from '../../store/checkpoints';
import {
  findConversation,
  findTurn,
  insertEvent,
  lastEventSeq,
  supersedeAttempts,
  turnId,
  updateConversation,
  updateTurn,
  upsertTurn,
  type TurnDoc,
} from '../../store/conversations';
import { parseRunnerSetting, RUNNER_PATH, runnerFile, STATE_DIR } from '../agents/agent-sessions';

/** What running turns needs: the store, and the sandbox host beside this worker. */
export interface TurnDeps {
  store: Store;
  host: HostClient;
  hostId: string;
}

export interface RunTurnArgs {
  conversationId: string;
  orgId: string;
  sandboxId: string;
  turn: number;
  /** The turn it continues from; its checkpoint's layer is where a retried attempt starts again. */
  after: number;
  startLayerId: string | null;
  message: string;
  attempt: number;
  runner?: string[];
  options: RunnerOptions;
  turnSeconds: number;
  /** Tokens left in the conversation's budget (undefined: no budget). */
  tokensLeft?: number;
  /** The fork point's sequence number: the conversation's own events start after it (0: not a fork; the first event is 1). */
  baseSeq: number;
  /** Values never stored in an event (the sandbox's secrets as the worker knows them). */
  scrub: string[];
  heartbeat: () => void;
}

const STATE_FILE = `${STATE_DIR}/conversation.json`;
const CONFIG_FILE = `${STATE_DIR}/conversation.config.json`;
/** How often a running turn looks for an interrupt request. */
const INTERRUPT_POLL_MS = 300;
/** How long a runner has, once interrupted (or its time is up), to say turn_complete before it is killed. */
const GRACE_MS = 5000;

/** Writes a conversation's events in order, each with the next sequence number, bounded per event and per conversation. */
export class EventWriter {
  private chain: Promise<void> = Promise.resolve();
  private full = false;
  constructor(
    private readonly store: Store,
    private readonly conversationId: string,
    private readonly turn: number,
    private readonly attempt: number,
    private seq: number,
    private count: number,
    private readonly scrub: string[],
  ) {}

  /** The sequence number of the last event written (or queued). */
  get last(): number {
    return this.seq;
  }

  /** Queues one event; `data` is the event as the runner printed it. */
  add(type: string, data: unknown): void {
    if (this.full) return;
    if (this.count >= CONVERSATION_BOUNDS.eventsPerConversation) {
      this.full = true;
      type = 'event_log_full';
      data = { type, message: `this conversation holds ${CONVERSATION_BOUNDS.eventsPerConversation} events; later ones are not stored` };
    }
    let text = JSON.stringify(data) ?? 'null';
    for (const s of this.scrub) if (text.includes(s)) text = text.split(s).join('[secret]');
    if (Buffer.byteLength(text) > CONVERSATION_BOUNDS.eventBytes) text = JSON.stringify({ type, truncated: true, bytes: Buffer.byteLength(text) });
    const seq = ++this.seq;
    this.count++;
    const doc = {
      _id: '',
      conversationId: this.conversationId,
      seq,
      turn: this.turn,
      attempt: this.attempt,
      level: eventLevel(type),
      type: type.slice(0, 100),
      data: text,
      at: new Date(),
    };
    doc._id = `${this.conversationId}:${String(seq).padStart(10, '0')}`;
    this.chain = this.chain.then(async () => {
      if (!(await insertEvent(this.store, doc))) throw new Error(`event ${seq} of ${this.conversationId} was written by another attempt`);
    });
  }

  /** Resolves once every queued event is stored (throws if one could not be). */
  flush(): Promise<void> {
    return this.chain;
  }
}

/** The tokens a runner reported on an event (the Claude Agent SDK's `usage` on `result`, or the same on `turn_complete`). */
function usageOf(e: Record<string, unknown>): { inputTokens: number; outputTokens: number } | null {
  const u = e.usage as { input_tokens?: unknown; output_tokens?: unknown; inputTokens?: unknown; outputTokens?: unknown } | undefined;
  if (!u || typeof u !== 'object') return null;
  const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : 0);
  return { inputTokens: n(u.input_tokens ?? u.inputTokens), outputTokens: n(u.output_tokens ?? u.outputTokens) };
}

/** The SDK session id the runner left in the sandbox (its state file), or undefined. */
async function resumeId(host: HostClient, sandboxId: string): Promise<string | undefined> {
  const buf = await host.readFile(sandboxId, STATE_FILE, { maxBytes: 4096 }).catch(() => null);
  if (!buf) return undefined;
  try {
    const id = (JSON.parse(buf.toString('utf8')) as { agentSessionID?: unknown }).agentSessionID;
    return typeof id === 'string' && id ? id : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Runs one turn (see the module's comment) and records it. A second attempt of the same turn (its
 * worker or host died mid-turn) first puts the sandbox back to the turn's starting checkpoint and
 * marks the first attempt's events superseded, so the runner never sees a half-applied turn.
 */
export async function runTurn(deps: TurnDeps, a: RunTurnArgs): Promise<TurnOutcome> {
  const [existing, lastSeq] = await Promise.all([findTurn(deps.store, a.conversationId, a.turn), lastEventSeq(deps.store, a.conversationId)]);
  // Its own events are numbered on from baseSeq without gaps (each takes the next, written in order): this many.
  const count = lastSeq === null ? 0 : Math.max(0, lastSeq - a.baseSeq);
  if (existing && existing.status !== 'running') {
    return { yieldReason: existing.yieldReason ?? 'completed', usage: existing.usage, endSeq: existing.endSeq ?? existing.startSeq, error: null };
  }
  const events = new EventWriter(deps.store, a.conversationId, a.turn, a.attempt, Math.max(lastSeq ?? a.baseSeq, a.baseSeq), count, a.scrub);
  const startSeq = events.last + 1;
  // The turn's first event is written at once; the sandbox is made ready beside it.
  if (a.attempt > 1) events.add('turn_restarted', { type: 'turn_restarted', turn: a.turn, attempt: a.attempt });
  events.add('message', { type: 'message', turn: a.turn, text: a.message });
  const turn: TurnDoc = {
    _id: turnId(a.conversationId, a.turn),
    conversationId: a.conversationId,
    orgId: a.orgId,
    turn: a.turn,
    message: a.message,
    status: 'running',
    yieldReason: null,
    usage: null,
    after: a.after,
    left: false,
    attempt: a.attempt,
    checkpointId: null,
    layerId: null,
    startSeq,
    endSeq: null,
    result: null,
    evaluation: null,
    startedAt: new Date(),
    endedAt: null,
  };
  const argv = a.runner ?? parseRunnerSetting(process.env.AGENT_RUNNER);
  await Promise.all([
    (async () => {
      if (a.attempt > 1) {
        // A second attempt starts from the turn's starting checkpoint: nothing of the first stays.
        await supersedeAttempts(deps.store, a.conversationId, a.turn, a.attempt);
        if (a.startLayerId) await deps.host.restore(a.sandboxId, a.startLayerId);
      }
      const id = await resumeId(deps.host, a.sandboxId);
      // One after the other: the host's parent-directory creation is not safe against a concurrent write.
      await deps.host.writeFile(a.sandboxId, RUNNER_PATH, runnerFile(), { mode: 0o755 });
      await deps.host.writeFile(a.sandboxId, CONFIG_FILE, JSON.stringify({ ...a.options, ...(id ? { resume: id } : {}) }), { mode: 0o600 });
    })(),
    upsertTurn(deps.store, turn),
    updateConversation(deps.store, a.conversationId, { status: 'running', turns: a.turn, interruptTurn: null }),
  ]);
  const exec = await deps.host.createExec(a.sandboxId, {
    cmd: 'node',
    args: [RUNNER_PATH, '--config', CONFIG_FILE, '--state', STATE_FILE, ...(argv ? ['--', ...argv] : [])],
    ...(a.options.cwd ? { cwd: a.options.cwd } : {}),
    timeout: a.turnSeconds + 30,
  });

  let yieldReason = null as YieldReason | null;
  let usage: { inputTokens: number; outputTokens: number } | null = null;
  let result: string | null = null;
  let error: string | null = null;
  const ws = deps.host.openExecSocket(a.sandboxId, exec.sessionID);
  const timers: NodeJS.Timeout[] = [];
  const outcome = await new Promise<{ exitCode: number | null }>((resolve) => {
    let completed = false;
    let partial = '';
    let errPartial = '';
    let closing = false;
    const send = (line: unknown) => {
      if (ws.readyState === ws.OPEN) ws.send(encodeStdinFrame(`${JSON.stringify(line)}\n`));
    };
    const stop = (reason: YieldReason) => {
      if (closing || completed) return;
      closing = true;
      yieldReason = reason;
      send({ type: 'interrupt' });
      timers.push(setTimeout(() => void deps.host.killExec(a.sandboxId, exec.sessionID, 'SIGKILL').catch(() => undefined), GRACE_MS));
    };
    const onLine = (line: string) => {
      if (!line.trim()) return;
      let e: Record<string, unknown>;
      try {
        const parsed = JSON.parse(line) as unknown;
        e = parsed && typeof parsed === 'object' && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : { type: 'output', value: parsed };
      } catch {
        e = { type: 'output', text: line.slice(0, 4096) };
      }
      const type = typeof e.type === 'string' ? e.type : 'output';
      if (type === 'result' && typeof e.result === 'string') result = e.result.slice(-4000);
      usage = usageOf(e) ?? usage;
      // The runner's turn_complete becomes the one the turn ends with (below), with the yield reason.
      if (type !== 'turn_complete') events.add(type, e);
      if (type === 'error' && typeof e.message === 'string') error = e.message.slice(0, 2000);
      if (type === 'turn_complete' && !completed) {
        completed = true;
        if (!yieldReason) {
          const said = typeof e.yield_reason === 'string' ? e.yield_reason : typeof e.yieldReason === 'string' ? e.yieldReason : undefined;
          yieldReason = said === 'needs_input' || e.needs_input === true ? 'needs_input' : error && !result ? 'error' : 'completed';
        }
        // The turn is over: the runner's stdin closes and it exits.
        if (ws.readyState === ws.OPEN) ws.send(encodeStdinFrame(''));
      }
    };
    ws.on('open', () => send({ type: 'prompt', text: a.message }));
    ws.on('message', (data: Buffer) => {
      const f = decodeExecFrame(Buffer.isBuffer(data) ? data : Buffer.from(data as ArrayBuffer));
      if (!f) return;
      if (f.kind === 'stdout') {
        partial += f.data.toString('utf8');
        let nl: number;
        while ((nl = partial.indexOf('\n')) >= 0) {
          onLine(partial.slice(0, nl));
          partial = partial.slice(nl + 1);
        }
        if (partial.length > CONVERSATION_BOUNDS.eventBytes * 4) partial = '';
      } else if (f.kind === 'stderr') {
        errPartial += f.data.toString('utf8');
        let nl: number;
        while ((nl = errPartial.indexOf('\n')) >= 0) {
          const l = errPartial.slice(0, nl);
          errPartial = errPartial.slice(nl + 1);
          if (l.trim()) events.add('stderr', { type: 'stderr', text: l.slice(0, 4096) });
        }
        if (errPartial.length > 64 * 1024) errPartial = '';
      } else if (f.kind === 'exit') {
        if (partial) onLine(partial);
        resolve({ exitCode: f.exitCode });
      }
    });
    ws.on('error', () => resolve({ exitCode: null }));
    ws.on('close', () => resolve({ exitCode: null }));
    timers.push(setTimeout(() => stop('deadline_exceeded'), a.turnSeconds * 1000));
    const poll = setInterval(() => {
      a.heartbeat();
      findConversation(deps.store, a.conversationId)
        .then((c) => {
          if (c?.interruptTurn === a.turn) stop('interrupted');
        })
        .catch(() => undefined);
    }, INTERRUPT_POLL_MS);
    timers.push(poll as unknown as NodeJS.Timeout);
  });
  for (const t of timers) clearTimeout(t);
  ws.close();
  if (outcome.exitCode === null && !yieldReason) throw new Error(`the runner's exec stream of turn ${a.turn} broke before the turn ended`);
  if (!yieldReason) {
    yieldReason = 'error';
    error ??= `the runner exited (code ${outcome.exitCode}) before turn_complete`;
  }
  const used = usage as { inputTokens: number; outputTokens: number } | null;
  if (yieldReason === 'completed' && used && a.tokensLeft !== undefined && used.inputTokens + used.outputTokens >= a.tokensLeft)
    yieldReason = 'budget_exceeded';
  events.add('turn_complete', { type: 'turn_complete', turn: a.turn, yieldReason, usage: used, ...(error ? { error } : {}) });
  await events.flush();
  const clean = (t: string | null) => (t === null ? null : a.scrub.reduce((acc, v) => acc.split(v).join('[secret]'), t));
  await updateTurn(deps.store, a.conversationId, a.turn, { endSeq: events.last, yieldReason, usage: used, result: clean(result) });
  return { yieldReason, usage: used, endSeq: events.last, error: clean(error) };
}

/**
 * Takes the checkpoint at a turn's end (a copy-on-write layer over the sandbox's previous ones),
 * records it as the organisation's checkpoint, and the turn as completed. Turn 0 is the starting
 * point of a new conversation. Idempotent: a turn that has its checkpoint answers it.
 */
export async function checkpointTurn(
  deps: TurnDeps,
  a: { conversationId: string; orgId: string; sandboxId: string; turn: number; after: number; outcome: TurnOutcome | null },
): Promise<{ checkpointId: string; layerId: string }> {
  const known = await findTurn(deps.store, a.conversationId, a.turn);
  if (known?.checkpointId && known.layerId) return { checkpointId: known.checkpointId, layerId: known.layerId };
  const checkpointId = turnCheckpointId(a.conversationId, a.turn);
  let layer: { layerId: string; parents: string[]; sizeBytes?: number };
  try {
    layer = await deps.host.createCheckpoint(a.sandboxId, checkpointId);
  } catch (err) {
    // A retry after the host took it: the layer is there.
    if ((err as { type?: string }).type !== 'conflict') throw err;
    layer = { layerId: checkpointId, parents: [] };
  }
  const doc: CheckpointDoc = {
    _id: checkpointId,
    orgId: a.orgId,
    sandboxId: a.sandboxId,
    hostId: deps.hostId,
    name: checkpointId,
    layerId: layer.layerId,
    parents: layer.parents,
    patchSeq: 0,
    status: 'ready',
    error: null,
    sizeBytes: layer.sizeBytes ?? null,
    createdAt: new Date(),
  };
  await insertCheckpoint(deps.store, doc).catch((err: { code?: number }) => {
    if (err.code !== 11000) throw err;
  });
  if (a.turn === 0) {
    await upsertTurn(deps.store, {
      _id: turnId(a.conversationId, 0),
      conversationId: a.conversationId,
      orgId: a.orgId,
      turn: 0,
      message: '',
      status: 'completed',
      yieldReason: 'completed',
      usage: null,
      after: 0,
      left: false,
      attempt: 1,
      checkpointId,
      layerId: layer.layerId,
      startSeq: 0,
      endSeq: 0,
      result: null,
      evaluation: null,
      startedAt: new Date(),
      endedAt: new Date(),
    });
  } else {
    const failed = a.outcome?.yieldReason === 'error';
    await updateTurn(deps.store, a.conversationId, a.turn, {
      status: failed ? 'failed' : 'completed',
      checkpointId,
      layerId: layer.layerId,
      endedAt: new Date(),
    });
  }
  return { checkpointId, layerId: layer.layerId };
}

/** Runs the best-of-N evaluation command in the sandbox and records its exit code and output tail on the turn. */
export async function evaluateTurn(
  deps: TurnDeps,
  a: { conversationId: string; sandboxId: string; turn: number; command: string },
): Promise<{ exitCode: number; outputTail: string }> {
  const r = await deps.host.execRun(a.sandboxId, { cmd: 'bash', args: ['-c', a.command], timeout: 600 });
  const out = `${r.stdout ?? ''}${r.stderr ?? ''}`;
  const evaluation = { exitCode: r.exitCode, outputTail: out.slice(-CONVERSATION_BOUNDS.evaluateTail) };
  await updateTurn(deps.store, a.conversationId, a.turn, { evaluation });
  return evaluation;
}
