"""The command palette's module finder: type part of a module's name, go to it."""

from __future__ import annotations

from functools import partial

from textual.command import Hit, Hits, Provider

from .messages import Goto
from .replay import ReplayScreen


class ModuleFinder(Provider):
    """Fuzzy-matches module names (``layer3`` finds ``model.layer3``, ``l3c1`` finds
    ``model.layer3.0.conv1``) and goes to the one picked, unfolding the tree to it."""

    def _replay(self) -> ReplayScreen | None:
        return next((s for s in self.app.screen_stack if isinstance(s, ReplayScreen)), None)

    async def search(self, query: str) -> Hits:
        replay = self._replay()
        if replay is None:
            return
        matcher = self.matcher(query)
        for module in replay.run.rec.modules:
            if not module.is_model_part:
                continue
            score = matcher.match(module.name)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(module.name),
                    partial(replay.post_message, Goto(module=module.id)),
                    help=f"{module.type}: go to this module",
                )
