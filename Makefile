.PHONY: check test lint fmt bench
check:
	scripts/check
test:
	pytest -q
lint:
	ruff check src packages tests bench && ruff format --check src packages tests bench && mypy
fmt:
	ruff format src packages tests bench && ruff check --fix src packages tests bench
bench:
	python bench/submit_bench.py
