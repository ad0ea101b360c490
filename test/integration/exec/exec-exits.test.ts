/**
 * Exec sessions' exits recorded when they happen (services/exec/exec-exits: each API process follows the
 * hosts' GET /exec-exits), not when someone reads the session.
 */
import { api, eventually, withMongo } from '../../helpers/env';
import { newSandbox } from '../../helpers/sandboxes';
import { startExec } from '../../helpers/exec';

describe('exec exits', () => {
  const created: string[] = [];

  afterAll(async () => {
    for (const id of created) await api('DELETE', `/api/sandboxes/${id}`);
  });

  it('records an exit when it happens, with nobody reading the session', async () => {
    const sb = await newSandbox({}, { created });
    const es = await startExec(sb, { cmd: 'bash', args: ['-c', 'exit 7'] });
    // Neither attached nor read through the API: the host's exit feed writes it.
    const rec = await eventually(() =>
      withMongo((c) =>
        c
          .db()
          .collection('exec_sessions')
          .findOne({ _id: es.sessionID as never, exitCode: 7 }),
      ),
    );
    expect(rec.exitedAt).toBeInstanceOf(Date);
    expect(rec.sandboxId).toBe(sb);
  });
});
