"""``python -m reef.engine serve …``: how ``reef serve`` starts the engine as a child."""

from reef.cli.engine import engine_app

if __name__ == "__main__":
    engine_app(prog_name="python -m reef.engine")
