/**
 * Adoption at a host's start: the sandboxes found in DATA_DIR (their state files) taken over, those
 * left half-made removed, those whose processes are gone marked stopped, and the respawn records of
 * hibernated sandboxes counted.
 */
import { promises as fsp } from 'node:fs';
import type { Logger } from 'pino';
import type { ProviderKind } from '../driver';
import { removeUnlinkedScratch } from '../scratch';
import type { SandboxState, StateFile } from './state-file';

/** What adoption needs of its provider. */
export interface AdoptionDeps {
  log: Logger;
  states: Map<string, SandboxState>;
  hibernated: Set<string>;
  stateFile: StateFile;
  kind(): ProviderKind;
  scratchDir(): string | null;
  sandboxesDir(): string;
  respawnDir(): string;
  dirOf(id: string): string;
  isLive(state: SandboxState): boolean;
  saveState(state: SandboxState): Promise<void>;
  /** The provider's hook for each sandbox adopted (see BaseProvider.adopted). */
  adopted(state: SandboxState): void;
  adoptInterruptedStart(state: SandboxState): Promise<void>;
  /** Destroys the sandbox with its lock already held. */
  destroyUnlocked(id: string): Promise<boolean>;
}

/** Adopts the sandboxes of DATA_DIR into `d.states` and the hibernated ones into `d.hibernated`. */
export async function adoptSandboxes(d: AdoptionDeps): Promise<void> {
  for (const id of await fsp.readdir(d.sandboxesDir())) {
    if (d.states.has(id)) continue;
    let state: SandboxState | undefined;
    try {
      state = await d.stateFile.read(id);
    } catch {
      state = undefined;
    }
    if (!state || state.status === 'creating' || state.provider !== d.kind()) {
      if (state && state.provider !== d.kind()) {
        d.log.warn({ sandboxId: id, provider: state.provider }, 'sandbox belongs to another provider; left alone');
        continue;
      }
      d.log.warn({ sandboxId: id }, 'removing incomplete sandbox');
      await d.destroyUnlocked(id).catch((err) => d.log.error({ err, sandboxId: id }, 'cleanup failed'));
      continue;
    }
    if (state.entrypoint?.starting) await d.adoptInterruptedStart(state);
    if (state.status === 'running' && !d.isLive(state)) {
      state.status = 'stopped';
      await d.saveState(state);
      d.log.warn({ sandboxId: id }, 'sandbox init is gone; marked stopped');
    }
    d.adopted(state);
    d.states.set(id, state);
  }
  await removeUnlinkedScratch(d.scratchDir(), (id) => d.dirOf(id));
  await fsp.mkdir(d.respawnDir(), { recursive: true, mode: 0o700 });
  for (const name of await fsp.readdir(d.respawnDir())) {
    if (!name.endsWith('.json')) continue;
    const id = name.slice(0, -'.json'.length);
    // A respawn record next to a live sandbox: the host died after the record, before the destroy.
    // Hibernation is then redone by the caller's retry; a restore is finished below.
    if (!d.states.has(id)) d.hibernated.add(id);
  }
}
