import { randomBytes } from 'node:crypto';
import type { Payload } from '@temporalio/common';
import { defaultPayloadConverter } from '@temporalio/common';
import { ENCRYPTED_ENCODING, OrgPayloadCodec, PLATFORM_ORG } from '../../lib/payload-codec';
import { createCodecService } from '../../services/codec';
import { SecretBox } from '../../lib/secret-box';
import type { Store } from '../../store';

const json = (v: unknown): Payload => defaultPayloadConverter.toPayload(v)!;
const plain = (p: Payload) => defaultPayloadConverter.fromPayload(p);
const meta = (p: Payload, k: string) => Buffer.from(p.metadata?.[k] ?? new Uint8Array()).toString('utf8');
const wf = (workflowId: string) => ({ type: 'workflow' as const, namespace: 'default', workflowId });

describe('the payload codec per organisation', () => {
  const master = randomBytes(32);
  const codec = new OrgPayloadCodec({ master, keyId: 'k1' });

  it("encrypts an object with an orgId under that organisation's key, named in its metadata, and opens it again", async () => {
    const [enc] = await codec.encode([json({ orgId: 'org-a', input: { secret: 'canary-1' } })], wf('sess_1'));
    expect(meta(enc!, 'encoding')).toBe(ENCRYPTED_ENCODING);
    expect(meta(enc!, 'encryption-org')).toBe('org-a');
    expect(meta(enc!, 'encryption-key-id')).toBe('k1');
    expect(Buffer.from(enc!.data!).toString('latin1')).not.toContain('canary-1');
    const [dec] = await codec.decode([enc!]);
    expect(plain(dec!)).toEqual({ orgId: 'org-a', input: { secret: 'canary-1' } });
  });

  it("gives a workflow's other payloads its organisation's key once met (by encoding or decoding), else the platform's", async () => {
    const fresh = new OrgPayloadCodec({ master, keyId: 'k1' });
    const [unknown] = await fresh.encode([json({ output: 'x' })], wf('sess_2'));
    expect(meta(unknown!, 'encryption-org')).toBe(PLATFORM_ORG);
    const [start] = await codec.encode([json({ orgId: 'org-b', input: 1 })], wf('sess_2'));
    await fresh.decode([start!], wf('sess_2'));
    const [result] = await fresh.encode([json({ output: 'y' })], { type: 'activity', namespace: 'default', workflowId: 'sess_2', isLocal: false });
    expect(meta(result!, 'encryption-org')).toBe('org-b');
  });

  it('asks orgOfWorkflow for a workflow it has not met', async () => {
    const looked: string[] = [];
    const c = new OrgPayloadCodec({ master, keyId: 'k1', orgOfWorkflow: async (id) => (looked.push(id), id === 'sess_3' ? 'org-c' : null) });
    const [r] = await c.encode([json({ output: 1 })], wf('sess_3'));
    expect(meta(r!, 'encryption-org')).toBe('org-c');
    await c.encode([json({ output: 2 })], wf('sess_3'));
    expect(looked).toEqual(['sess_3']);
  });

  it('leaves scalars (the summaries), binary/null and already-encrypted payloads as they are; encrypt: false passes everything', async () => {
    const summary = json('agent a · session sess_1');
    const none = defaultPayloadConverter.toPayload(undefined)!;
    const [s, n] = await codec.encode([summary, none], wf('sess_1'));
    expect(s).toBe(summary);
    expect(n).toBe(none);
    const [enc] = await codec.encode([json({ orgId: 'org-a' })]);
    expect((await codec.encode([enc!]))[0]).toBe(enc);
    const off = new OrgPayloadCodec({ master, keyId: 'k1', encrypt: false });
    const p = json({ orgId: 'org-a', input: 1 });
    expect((await off.encode([p]))[0]).toBe(p);
    // …and still opens what was encrypted before it was turned off.
    expect(plain((await off.decode([enc!]))[0]!)).toEqual({ orgId: 'org-a' });
  });

  it('refuses a payload relabelled to another organisation or key id, and one of another master key', async () => {
    const [enc] = await codec.encode([json({ orgId: 'org-a', input: 'x' })]);
    const relabel = (k: string, v: string): Payload => ({ ...enc!, metadata: { ...enc!.metadata, [k]: new TextEncoder().encode(v) } });
    await expect(codec.decode([relabel('encryption-org', 'org-b')])).rejects.toThrow(/does not open/);
    await expect(codec.decode([relabel('encryption-key-id', 'k2')])).rejects.toThrow(/does not open/);
    await expect(new OrgPayloadCodec({ master: randomBytes(32), keyId: 'k1' }).decode([enc!])).rejects.toThrow(/does not open/);
  });

  it('keeps every key id readable after rotation: new payloads get the new id', async () => {
    const [old] = await codec.encode([json({ orgId: 'org-a', n: 1 })]);
    const rotated = new OrgPayloadCodec({ master, keyId: 'k2' });
    const [now] = await rotated.encode([json({ orgId: 'org-a', n: 2 })]);
    expect(meta(now!, 'encryption-key-id')).toBe('k2');
    expect((await rotated.decode([old!, now!])).map(plain)).toEqual([
      { orgId: 'org-a', n: 1 },
      { orgId: 'org-a', n: 2 },
    ]);
  });
});

describe('the codec endpoint policy', () => {
  const secrets = new SecretBox(randomBytes(32));
  const codec = new OrgPayloadCodec({ master: secrets.derive('temporal-payloads'), keyId: 'k1' });
  const svc = createCodecService({ codec, secrets, store: {} as Store });
  const toJson = (p: Payload) => ({
    metadata: Object.fromEntries(Object.entries(p.metadata ?? {}).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
    data: Buffer.from(p.data ?? new Uint8Array()).toString('base64'),
  });

  it("opens a payload for its organisation's keys only; an operator's key opens the platform's and its own, never a tenant's", async () => {
    const [a, platform] = (await codec.encode([json({ orgId: 'org-a', input: 'canary-a' }), json({ n: 1 })])).map(toJson);
    const opened = (caller: { id: string; role: 'tenant' | 'operator' }) =>
      svc.decode(caller, [a!, platform!]).map((p) => Buffer.from(p.data ?? '', 'base64').toString('utf8'));
    expect(opened({ id: 'org-a', role: 'tenant' })[0]).toBe('{"orgId":"org-a","input":"canary-a"}');
    // The platform's payload comes back to a tenant as it was sent: still ciphertext. (Not "holds no `{`":
    // random ciphertext bytes read as UTF-8 hold one about one time in five.)
    expect(svc.decode({ id: 'org-a', role: 'tenant' }, [platform!])).toEqual([platform]);
    expect(opened({ id: 'org-b', role: 'tenant' }).join()).not.toContain('canary-a');
    expect(svc.decode({ id: 'org-b', role: 'tenant' }, [a!])).toEqual([a]);
    const op = opened({ id: 'ops', role: 'operator' });
    expect(op[0]).not.toContain('canary-a');
    expect(op[1]).toBe('{"n":1}');
  });
});
