.PHONY: install start test lint typecheck

install:
	npm ci --no-audit --no-fund

start:
	npm start

test:
	npm test

lint:
	npm run lint

typecheck:
	npm run typecheck
