"""Generic mode: the analyst env on another SQLite database with a JSONL task file."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from polyturn.envs.actions import format_action
from polyturn.envs.sql.env import SQLAnalystEnv
from polyturn.envs.sql.expert import SQLExpert

TASKS = [
    {"id": "count", "question": "How many books does the library have?", "gold_sql": "SELECT COUNT(*) FROM books"},
    {
        "id": "top-authors",
        "question": "Which 2 authors have the most books?",
        "gold_sql": "SELECT a.name, COUNT(*) AS n FROM books b JOIN authors a ON a.id = b.author_id "
        "GROUP BY a.name ORDER BY n DESC LIMIT 2",
        "difficulty": 2,
    },
    {
        "id": "popular-genre",
        "question": "What is the most popular genre?",
        "gold_sql": "SELECT b.genre FROM loans l JOIN books b ON b.id = l.book_id "
        "GROUP BY b.genre ORDER BY COUNT(*) DESC LIMIT 1",
        "clarifications": [
            {"trigger": "loan", "reply": "I mean the genre borrowed most often."},
            {"trigger": "copies", "reply": "Not by copies owned."},
        ],
        "difficulty": 3,
    },
    {
        "id": "lu-xun",
        "question": "Which books did Lu Xun write?",
        "gold_sql": "SELECT title FROM books WHERE author_id = 1",
        "clarifications": "I mean every book by 鲁迅 in the catalogue.",
        "difficulty": 2,
    },
    {"question": "How many days on average is a book kept?", "gold_sql": "SELECT ROUND(AVG(days), 2) FROM loans"},
]


@pytest.fixture()
def library(tmp_path: Path) -> tuple[Path, Path]:
    """A small library database (authors, books, loans) and its task file."""
    db = tmp_path / "library.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT, country TEXT);
        CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER, genre TEXT, copies INTEGER);
        CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER, loan_date TEXT, days INTEGER);
        INSERT INTO authors VALUES (1, 'Lu Xun', 'China'), (2, 'Jane Austen', 'UK'), (3, 'Mo Yan', 'China');
        INSERT INTO books VALUES
          (1, 'Call to Arms', 1, 'fiction', 3), (2, 'Wandering', 1, 'fiction', 1), (3, 'Wild Grass', 1, 'poetry', 9),
          (4, 'Emma', 2, 'novel', 2), (5, 'Persuasion', 2, 'novel', 1), (6, 'Red Sorghum', 3, 'novel', 1);
        INSERT INTO loans VALUES
          (1, 1, '2024-01-03', 7), (2, 1, '2024-02-10', 14), (3, 4, '2024-02-11', 3), (4, 5, '2024-03-01', 21),
          (5, 6, '2024-03-05', 5), (6, 4, '2024-04-01', 9), (7, 2, '2024-04-02', 2);
        """
    )
    conn.commit()
    conn.close()
    tasks = tmp_path / "library_tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t, ensure_ascii=False) for t in TASKS) + "\n", encoding="utf-8")
    return db, tasks


def test_make_and_check_env(library: tuple[Path, Path]) -> None:
    db, tasks = library
    env = gymnasium.make("polyturn/SQLAnalyst-v0", db_path=db, tasks_path=tasks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert not [str(w.message) for w in caught]
    env.close()


def test_gold_answers_from_gold_sql(library: tuple[Path, Path]) -> None:
    db, tasks = library
    env = SQLAnalystEnv(db_path=db, tasks_path=tasks)
    gold = {t.task_id: t.gold for t in env.task_pool}
    assert gold["count"].value == 6
    kinds = {t.task_id: t.answer_kind for t in env.task_pool}
    assert kinds == {"count": "number", "top-authors": "list", "popular-genre": "text", "lu-xun": "list",
                     "library_tasks-5": "number"}
    assert gold["top-authors"].value == ["Lu Xun", "Jane Austen"] and gold["top-authors"].ordered
    assert gold["popular-genre"].value == "novel"
    assert set(gold["lu-xun"].value) == {"Call to Arms", "Wandering", "Wild Grass"} and not gold["lu-xun"].ordered
    assert gold["library_tasks-5"].value == pytest.approx(8.71)
    env.close()


def test_episode_on_the_library(library: tuple[Path, Path]) -> None:
    db, tasks = library
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    env = SQLAnalystEnv(db_path=db, tasks_path=tasks)
    obs, info = env.reset(options={"task_id": "lu-xun"})
    assert obs == "Which books did Lu Xun write?" and info["ambiguous"] and info["level"] == 2
    assert "ask_user" in info["key_actions"] and "鲁迅" in info["privileged"]
    obs, *_ = env.step(format_action("list_tables"))
    assert obs == "Tables: authors, books, loans"
    obs, *_ = env.step(format_action("describe_table", {"table": "books"}))
    assert obs.startswith("books (table): id INTEGER, title TEXT, author_id INTEGER, genre TEXT, copies INTEGER")
    assert "genre values: fiction, novel, poetry" in obs
    obs, _, _, _, info = env.step(format_action("ask_user", {"question": "All of them?"}))
    assert obs == "I mean every book by 鲁迅 in the catalogue." and info["reward_terms"]["subgoal/clarified"] == 0.2
    obs, _, _, _, info = env.step(format_action("run_sql", {"sql": "SELECT title FROM books WHERE author_id = 1"}))
    assert info["reward_terms"]["subgoal/relevant_rows"] == 0.1
    obs, reward, terminated, _, info = env.step(
        format_action("submit_answer", {"answer": ["Wild Grass", "Call to Arms", "Wandering"]})
    )
    assert terminated and info["success"] and info["reward_terms"]["outcome/success"] == 10.0
    env.close()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_clarification_triggers(library: tuple[Path, Path]) -> None:
    db, tasks = library
    env = SQLAnalystEnv(db_path=db, tasks_path=tasks)
    env.reset(options={"task_id": "popular-genre"})
    reply = env.step(format_action("ask_user", {"question": "By number of loans?"}))[0]
    assert reply == "I mean the genre borrowed most often."
    env.reset(options={"task_id": "popular-genre"})
    both = env.step(format_action("ask_user", {"question": "Popular how?"}))[0]
    assert both == "I mean the genre borrowed most often. Not by copies owned."
    env.reset(options={"task_id": "count"})
    assert env.step(format_action("ask_user", {"question": "Which books?"}))[0] == "My question is complete as stated."
    env.close()


def test_levels_seeds_and_expert(library: tuple[Path, Path]) -> None:
    db, tasks = library
    env = SQLAnalystEnv(db_path=db, tasks_path=tasks)
    assert {env.reset(seed=s, options={"level": 2})[1]["task_id"] for s in range(30)} == {"top-authors", "lu-xun"}
    assert env.reset(seed=3)[0] == env.reset(seed=3)[0]
    with pytest.raises(ValueError, match="Expected tasks at levels"):
        env.reset(options={"level": 5})
    with pytest.raises(ValueError, match="Expected a task_id"):
        env.reset(options={"task_id": "missing"})
    expert = SQLExpert(env)
    for task in env.task_pool:
        obs, info = env.reset(options={"task_id": task.task_id})
        expert.reset(obs, info)
        actions = []
        while True:
            actions.append(expert.act(obs, info))
            obs, _, terminated, truncated, info = env.step(actions[-1])
            if terminated or truncated:
                break
        assert info["success"], (task.task_id, actions, obs)
        assert any("ask_user" in a for a in actions) == task.ambiguous
    env.close()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "Expected a JSON object, got invalid JSON"),
        ("[1, 2]", "Expected a JSON object, got list"),
        ('{"question": "q"}', "Expected non-empty string fields"),
        ('{"question": "q", "gold_sql": "SELECT * FROM nowhere"}', "Expected gold_sql to run"),
        ('{"question": "q", "gold_sql": "DROP TABLE books"}', "Expected gold_sql to run"),
        ('{"question": "q", "gold_sql": "SELECT 1", "difficulty": 9}', "Expected difficulty"),
        ('{"question": "q", "gold_sql": "SELECT 1", "clarifications": 3}', "Expected clarifications"),
        ('{"question": "q", "gold_sql": "SELECT 1", "answer": 3}', "unknown"),
    ],
)
def test_bad_task_files_name_the_line(library: tuple[Path, Path], tmp_path: Path, line: str, message: str) -> None:
    db, _ = library
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok", "gold_sql": "SELECT 1"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        SQLAnalystEnv(db_path=db, tasks_path=bad)
    assert "bad.jsonl:3" in str(err.value)


def test_other_database_needs_a_task_file(library: tuple[Path, Path]) -> None:
    db, _ = library
    with pytest.raises(ValueError, match="pass tasks_path"):
        SQLAnalystEnv(db_path=db)
