/**
 * The zod every contract schema is built with, extended with `.openapi()` (zod-to-openapi) here, so
 * the schemas carry their document names wherever they are imported.
 */
import { extendZodWithOpenApi } from '@asteasolutions/zod-to-openapi';
import { z, type ZodType } from 'zod';

extendZodWithOpenApi(z);

export { z, type ZodType };
