import type { ErrorBody } from '../contract/errors';
import type {
  AgentView,
  BatchItemInput,
  BatchResult,
  BatchView,
  CreateAgentInput,
  InstanceView,
  SessionResultView,
  SessionView,
  UpdateAgentInput,
} from '../contract/views';
import type { ConversationView, EventLevel, EventView, TurnView } from '../contract/conversations';

/** The types of the API's answers and bodies (contract/views.ts, inferred from the server's own zod schemas). */
export type { AgentView, BatchItemInput, BatchResult, BatchView, CreateAgentInput, InstanceView, SessionResultView, SessionView, UpdateAgentInput };
export type { ConversationView, EventLevel, EventView, TurnView };

/** An error answer of the API: its status and its `{ error: { type, message } }` body. */
export class SapApiError extends Error {
  override name = 'SapApiError';
  constructor(
    readonly status: number,
    readonly body: ErrorBody,
  ) {
    super(`${status} ${body.error.type}: ${body.error.message}`);
  }
  get type(): string {
    return this.body.error.type;
  }
}

export interface SapClientOptions {
  /** Base URL of the API, e.g. http://127.0.0.1:8080. */
  url: string;
  apiKey: string;
  /** Per-request timeout; default 60 s. */
  timeoutMs?: number;
}

/** One page of a list. */
export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}

/** One read of a batch's results: the lines, and where the next read starts. */
export interface ResultsPage {
  lines: BatchResult[];
  /** Pass as `after` to read on. */
  nextAfter: number;
  batchStatus: BatchView['status'];
  total: number;
}

const TERMINAL_SESSION = new Set(['completed', 'failed']);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A typed client of the platform's `/v1` API. Every method throws SapApiError for an error
 * answer (with the error body), and a plain Error when the server cannot be reached.
 */
export class SapClient {
  private readonly base: string;

  constructor(private readonly opts: SapClientOptions) {
    this.base = opts.url.replace(/\/+$/, '');
  }

  /** Sends one request; answers the raw Response for a 2xx, throws SapApiError otherwise. */
  async raw(
    method: string,
    path: string,
    opts: { json?: unknown; text?: string; contentType?: string; headers?: Record<string, string> } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { 'x-api-key': this.opts.apiKey, ...opts.headers };
    let body: string | undefined;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers['content-type'] = 'application/json';
    } else if (opts.text !== undefined) {
      body = opts.text;
      headers['content-type'] = opts.contentType ?? 'text/plain';
    }
    const res = await fetch(`${this.base}${path}`, { method, headers, body, signal: AbortSignal.timeout(this.opts.timeoutMs ?? 60_000) });
    if (res.ok) return res;
    const text = await res.text();
    let parsed: ErrorBody;
    try {
      parsed = JSON.parse(text) as ErrorBody;
      if (!parsed?.error?.type) throw new Error();
    } catch {
      parsed = { error: { type: res.status >= 500 ? 'internal' : 'invalid_request', message: text.slice(0, 500) || res.statusText } };
    }
    throw new SapApiError(res.status, parsed);
  }

  private async json<T>(method: string, path: string, opts: Parameters<SapClient['raw']>[2] = {}): Promise<T> {
    const res = await this.raw(method, path, opts);
    return (await res.json()) as T;
  }

  private static qs(q: Record<string, string | number | undefined>): string {
    const p = Object.entries(q)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
    return p.length ? `?${p.join('&')}` : '';
  }

  private static idem(key?: string): Record<string, string> {
    return key ? { 'idempotency-key': key } : {};
  }

  readonly agents = {
    create: (body: CreateAgentInput) => this.json<AgentView>('POST', '/v1/agents', { json: body }),
    get: (id: string) => this.json<AgentView>('GET', `/v1/agents/${encodeURIComponent(id)}`),
    update: (id: string, body: UpdateAgentInput) => this.json<AgentView>('PATCH', `/v1/agents/${encodeURIComponent(id)}`, { json: body }),
    delete: (id: string) => this.json<unknown>('DELETE', `/v1/agents/${encodeURIComponent(id)}`),
    list: async (q: { limit?: number; cursor?: string } = {}): Promise<Page<AgentView>> => {
      const r = await this.json<{ agents: AgentView[]; next_cursor: string | null }>('GET', `/v1/agents${SapClient.qs(q)}`);
      return { items: r.agents, next_cursor: r.next_cursor };
    },
  };

  readonly sessions = {
    create: (agentId: string, body: { input?: Record<string, unknown>; metadata?: Record<string, unknown> } = {}, opts: { idempotencyKey?: string } = {}) =>
      this.json<SessionView>('POST', `/v1/agents/${encodeURIComponent(agentId)}/sessions`, { json: body, headers: SapClient.idem(opts.idempotencyKey) }),
    /** Reads a session; with `waitSeconds` (≤ 60), answers as soon as it ends or when that time is up. */
    get: (agentId: string, id: string, opts: { waitSeconds?: number } = {}) =>
      this.json<SessionView>('GET', `/v1/agents/${encodeURIComponent(agentId)}/sessions/${id}${SapClient.qs({ wait: opts.waitSeconds })}`),
    list: async (agentId: string, q: { status?: string; limit?: number; cursor?: string } = {}): Promise<Page<SessionView>> => {
      const r = await this.json<{ sessions: SessionView[]; next_cursor: string | null }>(
        'GET',
        `/v1/agents/${encodeURIComponent(agentId)}/sessions${SapClient.qs(q)}`,
      );
      return { items: r.sessions, next_cursor: r.next_cursor };
    },
    /** The entrypoint's output in the order written (text), or one stream of it. */
    logs: async (agentId: string, id: string, opts: { stream?: 'stdout' | 'stderr' | 'all' } = {}): Promise<string> =>
      (
        await this.raw('GET', `/v1/agents/${encodeURIComponent(agentId)}/sessions/${id}/logs${SapClient.qs({ stream: opts.stream })}`, {
          headers: { accept: 'text/plain' },
        })
      ).text(),
    /** The result of a finished session; SapApiError 409 while it runs. */
    result: (agentId: string, id: string) => this.json<SessionResultView>('GET', `/v1/agents/${encodeURIComponent(agentId)}/sessions/${id}/result`),
    end: (agentId: string, id: string) => this.json<SessionView>('DELETE', `/v1/agents/${encodeURIComponent(agentId)}/sessions/${id}`),
    /** Starts a session, waits until it ends (long polls of ?wait), and answers the session and its result. */
    run: async (
      agentId: string,
      body: { input?: Record<string, unknown>; metadata?: Record<string, unknown> } = {},
      opts: { idempotencyKey?: string; timeoutMs?: number } = {},
    ) => {
      const s = await this.sessions.create(agentId, body, opts);
      const deadline = Date.now() + (opts.timeoutMs ?? 3_600_000);
      let cur = s;
      while (!TERMINAL_SESSION.has(cur.status)) {
        const left = deadline - Date.now();
        if (left <= 0) throw new Error(`session ${s.id} did not end within ${opts.timeoutMs} ms`);
        cur = await this.sessions.get(agentId, s.id, { waitSeconds: Math.min(30, Math.ceil(left / 1000)) });
      }
      return { session: cur, result: await this.sessions.result(agentId, s.id) };
    },
  };

  readonly instances = {
    create: (agentId: string, body: { metadata?: Record<string, unknown> } = {}) =>
      this.json<InstanceView>('POST', `/v1/agents/${encodeURIComponent(agentId)}/instances`, { json: body }),
    list: async (agentId: string): Promise<InstanceView[]> =>
      (await this.json<{ instances: InstanceView[] }>('GET', `/v1/agents/${encodeURIComponent(agentId)}/instances`)).instances,
  };

  readonly batches = {
    /** Starts a batch. With `ndjson`, items travel as application/x-ndjson (for big batches). */
    create: (
      agentId: string,
      body: { items: BatchItemInput[]; concurrency?: number; maxAttempts?: number },
      opts: { idempotencyKey?: string; ndjson?: boolean } = {},
    ) => {
      const path = `/v1/agents/${encodeURIComponent(agentId)}/batches`;
      const headers = SapClient.idem(opts.idempotencyKey);
      if (!opts.ndjson) return this.json<BatchView>('POST', path, { json: body, headers });
      const text = body.items.map((i) => JSON.stringify(i)).join('\n') + '\n';
      return this.json<BatchView>('POST', `${path}${SapClient.qs({ concurrency: body.concurrency, maxAttempts: body.maxAttempts })}`, {
        text,
        contentType: 'application/x-ndjson',
        headers,
      });
    },
    get: (agentId: string, id: string) => this.json<BatchView>('GET', `/v1/agents/${encodeURIComponent(agentId)}/batches/${id}`),
    /** A batch by id alone (within the caller's organisation). */
    getById: (id: string) => this.json<BatchView>('GET', `/v1/batches/${id}`),
    list: async (agentId: string, q: { status?: string; limit?: number; cursor?: string } = {}): Promise<Page<BatchView>> => {
      const r = await this.json<{ batches: BatchView[]; next_cursor: string | null }>(
        'GET',
        `/v1/agents/${encodeURIComponent(agentId)}/batches${SapClient.qs(q)}`,
      );
      return { items: r.batches, next_cursor: r.next_cursor };
    },
    cancel: (agentId: string, id: string) => this.json<BatchView>('DELETE', `/v1/agents/${encodeURIComponent(agentId)}/batches/${id}`),
    cancelById: (id: string) => this.json<BatchView>('DELETE', `/v1/batches/${id}`),
    /** One read of the finished items after index `after`, in index order. */
    results: async (agentId: string, id: string, q: { after?: number; limit?: number } = {}): Promise<ResultsPage> => {
      const res = await this.raw('GET', `/v1/agents/${encodeURIComponent(agentId)}/batches/${id}/results${SapClient.qs(q)}`);
      const text = await res.text();
      return {
        lines: text
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l) as BatchResult),
        nextAfter: Number(res.headers.get('x-next-after') ?? q.after ?? -1),
        batchStatus: (res.headers.get('x-batch-status') ?? 'running') as BatchView['status'],
        total: Number(res.headers.get('x-batch-total') ?? 0),
      };
    },
  };

  /** Conversations (docs/api/conversations.md): durable multi-turn agent sessions that fork at any turn. */
  readonly conversations = {
    create: (agentId: string, body: Record<string, unknown>, opts: { idempotencyKey?: string } = {}) =>
      this.json<ConversationView>('POST', `/v1/agents/${encodeURIComponent(agentId)}/conversations`, {
        json: body,
        headers: SapClient.idem(opts.idempotencyKey),
      }),
    get: (id: string) => this.json<ConversationView>('GET', `/v1/conversations/${encodeURIComponent(id)}`),
    list: async (agentId: string): Promise<ConversationView[]> =>
      (await this.json<{ conversations: ConversationView[] }>('GET', `/v1/agents/${encodeURIComponent(agentId)}/conversations`)).conversations,
    send: (id: string, text: string, opts: { idempotencyKey?: string } = {}) =>
      this.json<{ turn: number; queued: number }>('POST', `/v1/conversations/${encodeURIComponent(id)}/messages`, {
        json: { text },
        headers: SapClient.idem(opts.idempotencyKey),
      }),
    turns: async (id: string): Promise<TurnView[]> =>
      (await this.json<{ turns: TurnView[] }>('GET', `/v1/conversations/${encodeURIComponent(id)}/turns`)).turns,
    events: (id: string, q: { after?: number; level?: EventLevel; limit?: number } = {}) =>
      this.json<{ events: EventView[]; next: number }>('GET', `/v1/conversations/${encodeURIComponent(id)}/events${SapClient.qs(q)}`),
    interrupt: (id: string) => this.json<{ turn: number | null }>('POST', `/v1/conversations/${encodeURIComponent(id)}/interrupt`),
    cancel: (id: string) => this.json<{ dropped: number; interrupted: number | null }>('POST', `/v1/conversations/${encodeURIComponent(id)}/cancel`),
    archive: (id: string) => this.json<ConversationView>('POST', `/v1/conversations/${encodeURIComponent(id)}/archive`),
    rewind: (id: string, turn: number) =>
      this.json<{ headTurn: number; left: number[] }>('POST', `/v1/conversations/${encodeURIComponent(id)}/rewind`, { json: { turn } }),
    fork: (id: string, body: { turn: number; input?: string; count?: number; evaluate?: string }, opts: { idempotencyKey?: string } = {}) =>
      this.json<{ group: string | null; forks: ConversationView[] }>('POST', `/v1/conversations/${encodeURIComponent(id)}/fork`, {
        json: body,
        headers: SapClient.idem(opts.idempotencyKey),
      }),
    forkGroup: (group: string) =>
      this.json<{ group: string; done: boolean; ranked: { conversationId: string; exitCode: number | null; outputTail: string | null }[] }>(
        'GET',
        `/v1/conversations/forks/${encodeURIComponent(group)}`,
      ),
  };

  /**
   * A conversation's events after `after` (default 0: from the start), in order, each once, as they
   * are stored; polls every `pollMs` (default 250 ms) while none is new, until `until` says stop or
   * `signal` aborts. A caller that stops resumes later from the last `seq` it saw.
   */
  async *followConversation(
    id: string,
    opts: { after?: number; level?: EventLevel; pollMs?: number; signal?: AbortSignal; until?: (e: EventView) => boolean } = {},
  ): AsyncGenerator<EventView> {
    let after = opts.after ?? 0;
    for (;;) {
      if (opts.signal?.aborted) return;
      const page = await this.conversations.events(id, { after, level: opts.level, limit: 500 });
      for (const e of page.events) {
        yield e;
        if (opts.until?.(e)) return;
      }
      after = page.next;
      if (page.events.length === 0) await sleep(opts.pollMs ?? 250);
    }
  }

  /**
   * Every result of a batch after `after`, in index order, as items finish, until the batch is
   * over and every line is read. Polls every `pollMs` (default 1 s) while nothing new has finished.
   */
  async *followBatch(agentId: string, id: string, opts: { after?: number; pollMs?: number; signal?: AbortSignal } = {}): AsyncGenerator<BatchResult> {
    let after = opts.after ?? -1;
    for (;;) {
      if (opts.signal?.aborted) return;
      const page = await this.batches.results(agentId, id, { after });
      for (const line of page.lines) yield line;
      after = page.nextAfter;
      if (page.lines.length > 0) continue;
      if (page.batchStatus !== 'running' && after >= page.total - 1) return;
      await sleep(opts.pollMs ?? 1000);
    }
  }
}
