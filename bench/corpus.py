"""A deterministic synthetic knowledge base: N short chunks across D domains, Chinese and English.

Every chunk is one markdown document with front matter (title, one unique identifier keyword) and
a one- or two-sentence body, so chunk counts are exact: the chunker never merges or splits them.
Chunk ``i`` depends only on ``(seed, i)``, so corpora are nested: the first 1,000 chunks of the
10,000-chunk corpus are the 1,000-chunk corpus, and ingesting 1k -> 10k -> 50k embeds each chunk
once. Bodies are short on purpose (about 20 tokens with the model's prefix): the bundled e5-small embeds ~100 such
passages a second on two cores, which is what lets 50k chunks fit in the benchmark's budget.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SEED = 20240601


@dataclass(frozen=True)
class Domain:
    name: str
    prefix: str
    # (English, Chinese) names of the things this domain's chunks talk about.
    components: tuple[tuple[str, str], ...]
    params: tuple[str, ...]


DOMAINS: tuple[Domain, ...] = (
    Domain(
        "payments",
        "PAY",
        (
            ("settlement worker", "结算服务"),
            ("refund queue", "退款队列"),
            ("card gateway", "银行卡网关"),
            ("ledger writer", "账本写入"),
            ("invoice job", "发票任务"),
            ("payout scheduler", "打款调度"),
            ("fraud check", "风控校验"),
            ("wallet service", "钱包服务"),
        ),
        ("retry_budget", "settle_batch", "refund_ttl", "gateway_timeout_ms"),
    ),
    Domain(
        "database",
        "DB",
        (
            ("primary replica", "主库"),
            ("read replica", "只读副本"),
            ("connection pool", "连接池"),
            ("slow query log", "慢查询日志"),
            ("schema migration", "表结构变更"),
            ("backup job", "备份任务"),
            ("vacuum task", "清理任务"),
            ("index builder", "索引构建"),
        ),
        ("max_connections", "pool_size", "statement_timeout", "wal_buffers"),
    ),
    Domain(
        "networking",
        "NET",
        (
            ("load balancer", "负载均衡"),
            ("DNS resolver", "域名解析"),
            ("ingress proxy", "入口代理"),
            ("service mesh", "服务网格"),
            ("NAT gateway", "NAT 网关"),
            ("TLS terminator", "TLS 终结"),
            ("VPN tunnel", "VPN 隧道"),
            ("edge cache", "边缘缓存"),
        ),
        ("idle_timeout", "max_conns", "keepalive_s", "mtu"),
    ),
    Domain(
        "security",
        "SEC",
        (
            ("token issuer", "令牌签发"),
            ("secret store", "密钥存储"),
            ("audit logger", "审计日志"),
            ("login service", "登录服务"),
            ("key rotation", "密钥轮换"),
            ("WAF rule set", "防火墙规则"),
            ("permission check", "权限校验"),
            ("session store", "会话存储"),
        ),
        ("token_ttl", "rotate_days", "max_attempts", "lockout_s"),
    ),
    Domain(
        "observability",
        "OBS",
        (
            ("metrics agent", "指标采集"),
            ("log shipper", "日志投递"),
            ("trace collector", "链路采集"),
            ("alert router", "告警路由"),
            ("dashboard", "监控大盘"),
            ("uptime probe", "拨测探针"),
            ("error tracker", "错误追踪"),
            ("profiler", "性能剖析"),
        ),
        ("scrape_interval", "sample_rate", "retention_days", "alert_for"),
    ),
    Domain(
        "messaging",
        "MQ",
        (
            ("Kafka consumer", "Kafka 消费者"),
            ("topic partition", "主题分区"),
            ("dead letter queue", "死信队列"),
            ("event bus", "事件总线"),
            ("stream processor", "流处理"),
            ("message relay", "消息转发"),
            ("delay queue", "延迟队列"),
            ("outbox poller", "发件箱轮询"),
        ),
        ("max_poll_records", "session_timeout_ms", "retention_ms", "batch_size"),
    ),
    Domain(
        "frontend",
        "WEB",
        (
            ("checkout page", "结账页面"),
            ("asset bundler", "资源打包"),
            ("image CDN", "图片 CDN"),
            ("search box", "搜索框"),
            ("login form", "登录表单"),
            ("service worker", "离线缓存"),
            ("feature flag", "功能开关"),
            ("analytics tag", "埋点脚本"),
        ),
        ("chunk_limit_kb", "cache_max_age", "debounce_ms", "prefetch"),
    ),
    Domain(
        "data-platform",
        "DATA",
        (
            ("ETL pipeline", "ETL 管道"),
            ("Spark job", "Spark 作业"),
            ("warehouse loader", "数仓导入"),
            ("feature store", "特征存储"),
            ("batch scheduler", "批任务调度"),
            ("CDC connector", "CDC 连接器"),
            ("data quality check", "数据质检"),
            ("lake compaction", "数据湖合并"),
        ),
        ("executor_memory", "parallelism", "max_lag_s", "partition_count"),
    ),
)

# (English, Chinese) symptoms, shared by all domains.
SYMPTOMS: tuple[tuple[str, str], ...] = (
    ("times out after failover", "故障切换后超时"),
    ("runs out of memory", "内存溢出"),
    ("drops requests under load", "高峰期丢请求"),
    ("lags behind", "延迟积压"),
    ("restarts in a loop", "反复重启"),
    ("returns stale data", "返回旧数据"),
    ("rejects new connections", "拒绝新连接"),
    ("fills the disk", "磁盘写满"),
    ("spikes CPU at night", "夜间 CPU 飙高"),
    ("loses messages", "丢消息"),
    ("fails health checks", "健康检查失败"),
    ("slows down after deploy", "发布后变慢"),
)
_ACTIONS = (("raise", "调大"), ("lower", "调小"), ("tune", "调整"))
_FOLLOW_UPS = (
    ("Check the dashboard first.", "先看监控大盘。"),
    ("Roll back if it persists.", "持续则回滚。"),
    ("Page the on-call owner.", "通知值班负责人。"),
    ("Open an incident ticket.", "提交故障工单。"),
)


@dataclass(frozen=True)
class SyntheticChunk:
    index: int
    domain: str
    identifier: str  # the unique keyword: an L0 query naming it is an exact match
    language: str  # "en" or "zh"
    title: str
    text: str

    @property
    def relative_path(self) -> str:
        return f"{self.domain}/{self.identifier.lower()}.md"

    def markdown(self) -> str:
        return (
            f"---\ntitle: {self.title}\ndomain: {self.domain}\nkeywords: [{self.identifier}]\n---\n\n"
            f"{self.text}\n"
        )


def chunk(index: int, *, seed: int = DEFAULT_SEED, domains: int = len(DOMAINS)) -> SyntheticChunk:
    """Chunk number index of the corpus; a pure function of (seed, index, domains)."""
    if not 1 <= domains <= len(DOMAINS):
        raise ValueError(f"domains must be between 1 and {len(DOMAINS)}, got {domains}")
    rng = random.Random(f"{seed}:{index}")
    domain = DOMAINS[index % domains]
    component = rng.choice(domain.components)
    symptom = rng.choice(SYMPTOMS)
    action = rng.choice(_ACTIONS)
    param = rng.choice(domain.params)
    value = rng.randrange(2, 500) if rng.random() < 0.35 else None
    language = "zh" if rng.random() < 0.5 else "en"
    follow_up = rng.choice(_FOLLOW_UPS) if rng.random() < 0.1 else None
    identifier = f"{domain.prefix}_{index:06d}"
    if language == "en":
        target = f" to {value}" if value is not None else ""
        text = f"{component[0].capitalize()} {symptom[0]}: {action[0]} {param}{target}."
        if follow_up:
            text += " " + follow_up[0]
        title = f"{identifier} {component[0]}"
    else:
        target = f" {value}" if value is not None else ""
        text = f"{component[1]}{symptom[1]}：{action[1]} {param}{target}。"
        if follow_up:
            text += follow_up[1]
        title = f"{identifier} {component[1]}"
    return SyntheticChunk(index, domain.name, identifier, language, title, text)


def corpus(n: int, *, seed: int = DEFAULT_SEED, domains: int = len(DOMAINS)) -> list[SyntheticChunk]:
    """The first n chunks."""
    if n < 0:
        raise ValueError(f"corpus size must not be negative, got {n}")
    return [chunk(i, seed=seed, domains=domains) for i in range(n)]


def write_knowledge_base(root: Path, chunks: list[SyntheticChunk]) -> int:
    """Write each chunk's document under root, skipping files already there; returns files written."""
    written = 0
    for item in chunks:
        path = root / item.relative_path
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(item.markdown(), encoding="utf-8")
        written += 1
    return written


def fresh_queries(*, seed: int = DEFAULT_SEED, domains: int = len(DOMAINS)) -> Iterator[str]:
    """Distinct natural-language questions about the corpus's topics, in a seeded order.

    They name no identifier, so they take the semantic (L1) path; being distinct, they never
    hit the evidence cache or the query-embedding cache.
    """
    en = (
        "how do I fix {c} that {s}?",
        "{c} {s}, which setting should I change?",
        "what to do when the {c} {s}",
        "{c} {s} - known fix?",
    )
    zh = ("{c}{s}怎么办", "{c}{s}应该调整哪个参数", "{c}{s}的处理方法", "遇到{c}{s}如何排查")
    combos = [
        (d, c, s, t, lang)
        for d in DOMAINS[:domains]
        for c in d.components
        for s in SYMPTOMS
        for t in range(4)
        for lang in ("en", "zh")
    ]
    random.Random(f"{seed}:queries").shuffle(combos)
    for _, c, s, t, lang in combos:
        if lang == "en":
            yield en[t].format(c=c[0], s=s[0])
        else:
            yield zh[t].format(c=c[1], s=s[1])
    raise RuntimeError(f"the fresh-query stream is exhausted after {len(combos)} distinct queries")


def identifier_query(item: SyntheticChunk) -> str:
    """A question that names one chunk's identifier: an exact (L0) match, graded PRECISE."""
    return f"{item.identifier} 是什么" if item.language == "zh" else f"what is {item.identifier}?"


def take(stream: Iterator[str], count: int) -> list[str]:
    """The next count items of a query stream."""
    return list(itertools.islice(stream, count))
