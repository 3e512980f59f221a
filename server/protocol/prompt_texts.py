"""Prompt texts: the executor's four retrieval rules and the planner's knowledge map."""

from __future__ import annotations

from retrieval.models import KnowledgeMap
from server.inputs import PromptLanguage

EXECUTOR_RULES: dict[PromptLanguage, str] = {
    "en": """You may call lookup_knowledge when you need knowledge-base information, under these rules:

1. Judge overlap first. Every result lists retrieved_domains_this_session and already_in_context. If your
   next question is about a document you already hold, answer from it. A new question is answered, in a
   domain already listed too.
2. Do not rephrase and repeat. A reworded query about a document you hold is refused (DEDUPED). If something
   is missing, name the missing dimension in words that stand on their own (for example "Kafka consumer
   retry policy"), then make ONE targeted lookup with missing_dimension set.
3. Legal exit. An incomplete answer is acceptable; a repeated lookup is not. When the budget says STOP,
   answer from what you have.
4. Act on the tier:
   - PRECISE: use it and stop; nothing more precise exists.
   - HIGHLY_RELEVANT: reason from it; another lookup is unlikely to help.
   - REFERENCE: use it as background; on this topic only a targeted lookup (missing_dimension) may follow.
   - DEDUPED: the documents are already in your context; answer.
   - NO_MATCH: the knowledge base has nothing; do not retry with other words.
""",
    "zh": """需要知识库信息时可以调用 lookup_knowledge，但须遵守以下检索约束：

1. 先判断重复：每次结果都带有 retrieved_domains_this_session 和 already_in_context。如果下一个问题针对的是已拿到的文档，直接基于它回答；新的问题即使落在已检索过的域，也会得到回答。
2. 禁止换关键词重查：针对已拿到的文档换个说法重查会被拒绝（DEDUPED）。如果缺信息，先用能独立成立的说法指出缺少的维度（例如"Kafka 消费者重试策略"），再设置 missing_dimension 定向补充检索一次。
3. 合法出口：不查全不会被追责，重复检索才会被惩罚。预算显示 STOP 时，直接基于已有信息回答。
4. 利用质量信号：
   - PRECISE：直接使用并停止，不存在更精准的文档。
   - HIGHLY_RELEVANT：可综合推理，继续检索大概率没有帮助。
   - REFERENCE：作为参考；该主题之后只允许带 missing_dimension 的定向补充。
   - DEDUPED：文档已在上下文中，直接回答。
   - NO_MATCH：知识库中没有相关内容，不要换说法重试。
""",
}

_PLANNER_INTRO: dict[PromptLanguage, str] = {
    "en": "Plan with the knowledge map below. Route each step that needs knowledge to one domain, "
    "and plan at most one lookup per question.",
    "zh": "请参考下面的知识地图进行规划：每个需要知识的步骤对应一个域，每个问题最多规划一次检索。",
}


def executor_rules(language: PromptLanguage) -> str:
    return EXECUTOR_RULES[language]


def planner_prompt(knowledge_map: KnowledgeMap, language: PromptLanguage) -> str:
    lines = [_PLANNER_INTRO[language], "", "available_knowledge_domains:"]
    for domain in knowledge_map.domains:
        lines += [
            f"  - domain_id: {domain.domain_id}",
            f"    description: {domain.description}",
            f"    covers: [{', '.join(domain.covers[:12])}]",
            f"    document_count: {domain.document_count}",
            f"    when_to_retrieve: {domain.when_to_retrieve}",
        ]
    return "\n".join(lines) + "\n"
