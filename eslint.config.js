// ESLint (flat config): the JavaScript and typescript-eslint recommended rules; formatting is
// Prettier's (eslint-config-prettier turns the overlapping rules off).
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  // .stryker-tmp/ holds npm run mutate's sandboxes (a second tsconfig root while a run goes on).
  { ignores: ['node_modules/', 'build/', 'dist/', 'prebuilds/', 'bench/.build/', 'bench/results/', '.stryker-tmp/', 'reports/', 'docs/api/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: {
        process: 'readonly',
        console: 'readonly',
        performance: 'readonly',
        queueMicrotask: 'readonly',
        setTimeout: 'readonly',
        clearTimeout: 'readonly',
        setInterval: 'readonly',
        clearInterval: 'readonly',
        setImmediate: 'readonly',
        Buffer: 'readonly',
        URL: 'readonly',
      },
    },
    rules: {
      // tsc's noUnusedLocals / noUnusedParameters already report these, with the same meaning.
      '@typescript-eslint/no-unused-vars': 'off',
    },
  },
  prettier,
);
