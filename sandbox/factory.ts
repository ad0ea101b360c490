/** Picks the driver of a host: the one place that knows every provider class (see ./driver for the interface). */
import type { ProviderKind, ProviderOptions, SandboxProvider } from './driver';
import { NamespaceProvider } from './namespaces/provider';
import { ProcessProvider } from './unisolated-provider';

/** Creates the provider of the given kind. The `process` provider offers no isolation and says so in the log. */
export function createSandboxProvider(opts: ProviderOptions & { kind: ProviderKind }): SandboxProvider {
  if (opts.kind === 'namespaces') return new NamespaceProvider(opts);
  if (opts.kind === 'process') return new ProcessProvider(opts);
  throw new Error(`unknown sandbox provider: ${String(opts.kind)}`);
}
