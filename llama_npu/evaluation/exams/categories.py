"""Which category each subject counts toward in the summary. lm-eval groups MMLU's subjects
itself (the `tag` of each subject's YAML); for C-Eval and CMMLU it has one flat group, so
their authors' categories are written out here: C-Eval's subject_mapping.json (four
categories, and the "hard" subset of its paper) and CMMLU's src/categories.py (five, "China
specific" overlapping the others). Both were checked entry by entry against those files
(hkust-nlp/ceval, haonan-li/CMMLU); C-Eval's file names no category for clinical_medicine,
which its paper's table counts under Other."""
from __future__ import annotations

from typing import List

_CEVAL = {
    "STEM": "computer_network operating_system computer_architecture college_programming college_physics "
            "college_chemistry advanced_mathematics probability_and_statistics discrete_mathematics "
            "electrical_engineer metrology_engineer high_school_mathematics high_school_physics "
            "high_school_chemistry high_school_biology middle_school_mathematics middle_school_biology "
            "middle_school_physics middle_school_chemistry veterinary_medicine",
    "Social Science": "college_economics business_administration marxism mao_zedong_thought education_science "
                      "teacher_qualification high_school_politics high_school_geography middle_school_politics "
                      "middle_school_geography",
    "Humanities": "modern_chinese_history ideological_and_moral_cultivation logic law "
                  "chinese_language_and_literature art_studies professional_tour_guide legal_professional "
                  "high_school_chinese high_school_history middle_school_history",
    "Other": "civil_servant sports_science plant_protection basic_medicine clinical_medicine urban_and_rural_planner "
             "accountant fire_engineer environmental_impact_assessment_engineer tax_accountant physician",
    "Hard": "advanced_mathematics discrete_mathematics probability_and_statistics college_chemistry college_physics "
            "high_school_mathematics high_school_chemistry high_school_physics",
}

# CMMLU: subject -> its subcategories; a subcategory belongs to one category.
_CMMLU_SUBCATEGORIES = {
    "agronomy": "other", "anatomy": "biology", "ancient_chinese": "linguistics china_specific", "arts": "arts",
    "astronomy": "physics", "business_ethics": "business", "chinese_civil_service_exam": "politics china_specific",
    "chinese_driving_rule": "other china_specific", "chinese_food_culture": "culture china_specific",
    "chinese_foreign_policy": "politics china_specific", "chinese_history": "history china_specific",
    "chinese_literature": "literature china_specific", "chinese_teacher_qualification": "education china_specific",
    "clinical_knowledge": "other", "college_actuarial_science": "math", "college_education": "education",
    "college_engineering_hydrology": "engineering", "college_law": "law", "college_mathematics": "math",
    "college_medical_statistics": "statistics", "college_medicine": "other", "computer_science": "computer_science",
    "computer_security": "other", "conceptual_physics": "physics",
    "construction_project_management": "other china_specific", "economics": "economics", "education": "education",
    "electrical_engineering": "engineering", "elementary_chinese": "linguistics china_specific",
    "elementary_commonsense": "other china_specific", "elementary_information_and_technology": "other",
    "elementary_mathematics": "math", "ethnology": "culture china_specific", "food_science": "other",
    "genetics": "biology", "global_facts": "global", "high_school_biology": "biology",
    "high_school_chemistry": "chemistry", "high_school_geography": "geography", "high_school_mathematics": "math",
    "high_school_physics": "physics", "high_school_politics": "politics china_specific", "human_sexuality": "other",
    "international_law": "law", "journalism": "sociology", "jurisprudence": "law", "legal_and_moral_basis": "other",
    "logical": "philosophy", "machine_learning": "computer_science", "management": "business",
    "marketing": "business", "marxist_theory": "philosophy", "modern_chinese": "linguistics china_specific",
    "nutrition": "other", "philosophy": "philosophy", "professional_accounting": "business",
    "professional_law": "law", "professional_medicine": "other", "professional_psychology": "psychology",
    "public_relations": "politics", "security_study": "politics", "sociology": "culture",
    "sports_science": "other", "traditional_chinese_medicine": "other china_specific", "virology": "biology",
    "world_history": "history", "world_religions": "global",
}
_CMMLU_CATEGORIES = {
    "STEM": "physics chemistry biology computer_science math engineering statistics",
    "Humanities": "history philosophy law arts literature global",
    "Social Science": "linguistics business politics culture economics geography psychology education sociology",
    "Other": "other",
    "China specific": "china_specific",
}


def ceval_categories(subject: str) -> List[str]:
    return [name for name, subjects in _CEVAL.items() if subject in subjects.split()]


def cmmlu_categories(subject: str) -> List[str]:
    subcategories = _CMMLU_SUBCATEGORIES.get(subject, "").split()
    return [name for name, subs in _CMMLU_CATEGORIES.items() if set(subs.split()) & set(subcategories)]


def mmlu_categories(tag: str) -> List[str]:
    """lm-eval's tag, e.g. mmlu_social_sciences_tasks -> Social Sciences."""
    return [tag.removeprefix("mmlu_").removesuffix("_tasks").replace("_", " ").title().replace("Stem", "STEM")]


CATEGORY_ORDER = {"ceval": list(_CEVAL), "cmmlu": list(_CMMLU_CATEGORIES),
                  "mmlu": ["STEM", "Humanities", "Social Sciences", "Other"]}


def categories_of(task: str, subject: str, config: dict) -> List[str]:
    """The categories `subject` counts toward; `config` is its lm-eval task config."""
    if task == "ceval":
        return ceval_categories(subject)
    if task == "cmmlu":
        return cmmlu_categories(subject)
    return mmlu_categories(config.get("tag", "mmlu_other_tasks"))
