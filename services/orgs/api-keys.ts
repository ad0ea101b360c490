/** Who an API key acts for: its organisation and its role (tenant or operator), by the key's hash. */
import type { KeyRole, Store } from '../../store';
import { grantOfKeyHash } from '../../store/orgs';

export type { KeyRole };

/** The API keys, as the API's authentication asks them. */
export interface KeyService {
  /** The organisation and role of the key whose hash is `keyHash`; null for no such key. */
  grantOf(keyHash: string): Promise<{ orgId: string; role: KeyRole } | null>;
}

export function createKeyService(store: Store): KeyService {
  return { grantOf: (keyHash) => grantOfKeyHash(store, keyHash) };
}
