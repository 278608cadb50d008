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

# The operator end to end on a kind cluster (needs Docker, kind, kubectl, helm): scripts/kind-e2e.sh
.PHONY: kind-e2e
kind-e2e:
	./scripts/kind-e2e.sh
