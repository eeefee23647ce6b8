.PHONY: check test lint fmt bench
check:
	scripts/check
test:
	pytest -q
lint:
	ruff check src tests bench && ruff format --check src tests bench && mypy
fmt:
	ruff format src tests bench && ruff check --fix src tests bench
bench:
	python bench/submit_bench.py
