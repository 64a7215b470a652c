// `npm run lint`: a small rule set (the recommended rules of ESLint and typescript-eslint,
// without type information so it runs in seconds), plus the few house rules of docs/development.md.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'data/', 'coverage/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { ecmaVersion: 2023, sourceType: 'module', globals: { process: 'readonly', console: 'readonly', Buffer: 'readonly', URL: 'readonly', setTimeout: 'readonly', clearTimeout: 'readonly', setInterval: 'readonly', clearInterval: 'readonly', setImmediate: 'readonly', fetch: 'readonly', AbortSignal: 'readonly', AbortController: 'readonly', TextEncoder: 'readonly', TextDecoder: 'readonly', queueMicrotask: 'readonly', structuredClone: 'readonly', performance: 'readonly', NodeJS: 'readonly' } },
    rules: {
      // Unused arguments named _x are the convention for a callback's unused parameters.
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      // No default exports (docs/architecture.md "Conventions"): named exports only.
      'no-restricted-syntax': ['error', { selector: 'ExportDefaultDeclaration', message: 'Use named exports.' }],
      eqeqeq: ['error', 'always', { null: 'ignore' }],
      'no-console': 'off',
      // Deliberate: input is checked for control characters, which these patterns name.
      'no-control-regex': 'off',
    },
  },
  {
    // Configuration files of tools, and the test setup, must default-export.
    files: ['vitest.config.ts', 'eslint.config.js', 'test/helpers/global-setup.ts'],
    rules: { 'no-restricted-syntax': 'off' },
  },
);
