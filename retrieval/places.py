"""Places a question may name, in Chinese and in English: China's provinces and larger cities,
and the countries and cities a team's work most often reaches abroad.

A place the knowledge base writes in neither script is one it has nothing specific on ("郑州仓",
"the Chengdu branch"): strong evidence against HIGHLY_RELEVANT, though none for NO_MATCH, since
the question's topic may still be covered. English marks a place with a capital, which the
unseen-name check reads already; Chinese has no such mark, so the names are listed. The list is
general knowledge, not any knowledge base's: the provincial-level divisions, their capitals and
the other large cities, and the countries and foreign cities trade and travel name most. Names
that are also common words are left out (开封 "unsealed", 日照 "sunlight", 三明治 "sandwich").
China itself (``HOME_PLACES``) a Chinese team's knowledge base takes as read.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from storage.text import CJK, CJK_FUNCTION_CHARS, terms

# Chinese:English spellings of one place, comma-separated; a "#" line is a heading.
_LIST = """
# Provincial-level divisions.
北京:Beijing, 天津:Tianjin, 上海:Shanghai, 重庆:Chongqing
河北:Hebei, 山西:Shanxi, 辽宁:Liaoning, 吉林:Jilin
黑龙江:Heilongjiang, 江苏:Jiangsu, 浙江:Zhejiang, 安徽:Anhui
福建:Fujian, 江西:Jiangxi, 山东:Shandong, 河南:Henan
湖北:Hubei, 湖南:Hunan, 广东:Guangdong, 海南:Hainan
四川:Sichuan, 贵州:Guizhou, 云南:Yunnan, 陕西:Shaanxi
甘肃:Gansu, 青海:Qinghai, 台湾:Taiwan, 内蒙古:Inner Mongolia
广西:Guangxi, 西藏:Tibet, 宁夏:Ningxia, 新疆:Xinjiang
香港:Hong Kong, 澳门:Macau
# Provincial capitals.
石家庄:Shijiazhuang, 太原:Taiyuan, 沈阳:Shenyang, 长春:Changchun
哈尔滨:Harbin, 南京:Nanjing, 杭州:Hangzhou, 合肥:Hefei
福州:Fuzhou, 南昌:Nanchang, 济南:Jinan, 郑州:Zhengzhou
武汉:Wuhan, 长沙:Changsha, 广州:Guangzhou, 海口:Haikou
成都:Chengdu, 贵阳:Guiyang, 昆明:Kunming, 西安:Xi'an
兰州:Lanzhou, 西宁:Xining, 呼和浩特:Hohhot, 南宁:Nanning
拉萨:Lhasa, 银川:Yinchuan, 乌鲁木齐:Urumqi, 台北:Taipei
# Other large cities.
深圳:Shenzhen, 厦门:Xiamen, 青岛:Qingdao, 大连:Dalian
宁波:Ningbo, 苏州:Suzhou, 无锡:Wuxi, 东莞:Dongguan
佛山:Foshan, 珠海:Zhuhai, 温州:Wenzhou, 常州:Changzhou
南通:Nantong, 徐州:Xuzhou, 烟台:Yantai, 唐山:Tangshan
保定:Baoding, 洛阳:Luoyang, 泉州:Quanzhou, 惠州:Huizhou
中山:Zhongshan, 汕头:Shantou, 嘉兴:Jiaxing, 绍兴:Shaoxing
金华:Jinhua, 扬州:Yangzhou, 镇江:Zhenjiang, 芜湖:Wuhu
赣州:Ganzhou, 桂林:Guilin, 三亚:Sanya, 宜昌:Yichang
襄阳:Xiangyang, 株洲:Zhuzhou, 绵阳:Mianyang, 柳州:Liuzhou
包头:Baotou, 威海:Weihai, 潍坊:Weifang, 临沂:Linyi
淄博:Zibo, 昆山:Kunshan, 义乌:Yiwu, 连云港:Lianyungang
盐城:Yancheng, 舟山:Zhoushan, 湖州:Huzhou, 漳州:Zhangzhou
湛江:Zhanjiang, 江门:Jiangmen, 齐齐哈尔:Qiqihar, 喀什:Kashgar
# Countries and regions.
中国:China, 欧洲:Europe, 欧盟:EU, 东南亚:Southeast Asia
日本:Japan, 韩国:Korea, 美国:United States, 英国:Britain, 英国:UK
法国:France, 德国:Germany, 意大利:Italy, 西班牙:Spain
葡萄牙:Portugal, 荷兰:Netherlands, 比利时:Belgium, 瑞士:Switzerland
瑞典:Sweden, 挪威:Norway, 丹麦:Denmark, 芬兰:Finland
波兰:Poland, 俄罗斯:Russia, 土耳其:Turkey, 印度:India
印度尼西亚:Indonesia, 印尼:Indonesia, 泰国:Thailand
越南:Vietnam, 马来西亚:Malaysia, 新加坡:Singapore
菲律宾:Philippines, 柬埔寨:Cambodia, 缅甸:Myanmar
澳大利亚:Australia, 澳洲:Australia, 新西兰:New Zealand, 加拿大:Canada, 墨西哥:Mexico
巴西:Brazil, 阿根廷:Argentina, 智利:Chile, 埃及:Egypt, 南非:South Africa
沙特:Saudi Arabia, 阿联酋:UAE, 以色列:Israel, 巴基斯坦:Pakistan
哈萨克斯坦:Kazakhstan, 蒙古:Mongolia
# Foreign cities.
东京:Tokyo, 大阪:Osaka, 首尔:Seoul, 纽约:New York
伦敦:London, 巴黎:Paris, 柏林:Berlin, 悉尼:Sydney
墨尔本:Melbourne, 多伦多:Toronto, 温哥华:Vancouver
洛杉矶:Los Angeles, 旧金山:San Francisco, 曼谷:Bangkok
河内:Hanoi, 胡志明市:Ho Chi Minh City, 吉隆坡:Kuala Lumpur
雅加达:Jakarta, 孟买:Mumbai, 迪拜:Dubai, 法兰克福:Frankfurt
阿姆斯特丹:Amsterdam
"""


PLACES: tuple[tuple[str, str], ...] = tuple(
    (zh, en)
    for line in _LIST.splitlines()
    if line and not line.startswith("#")
    for zh, en in (entry.split(":") for entry in line.split(", "))
)
# A place's first English name, lower-cased, is its identity; each spelling maps to it, and the
# identity to every spelling.
_IDENTITY: dict[str, str] = {}
_SPELLINGS: dict[str, dict[str, None]] = {}  # identity -> its spellings, in order, once each
for _zh, _en in PLACES:
    _IDENTITY.setdefault(_zh, _en.lower())
    _IDENTITY[_en.lower()] = _IDENTITY[_zh]
    _SPELLINGS.setdefault(_IDENTITY[_zh], {}).update(dict.fromkeys((_zh, _en.lower())))
# Places a knowledge base seldom writes because it is in them: unwritten, they are no unseen name.
HOME_PLACES = frozenset({"中国", "china"})
# Chinese names by their first character, longest first, so that 印度尼西亚 is read before 印度
# and 内蒙古 before 蒙古 (a dictionary walk: an alternation of every name costs ~0.2 ms a query).
_BY_FIRST: dict[str, list[str]] = {}
for _name in sorted({zh for zh, _ in PLACES}, key=len, reverse=True):
    _BY_FIRST.setdefault(_name[0], []).append(_name)
# Latin names as written, capitalised ("Turkey", not "turkey"), of one to four words.
_LATIN = frozenset(en for _, en in PLACES)
_LATIN_WORDS = max(len(en.split()) for en in _LATIN)
_WORD = re.compile(r"[A-Za-z][A-Za-z']*")


def places_named(query: str, frequency: Callable[[str], int]) -> list[str]:
    """The places ``query`` names, each as the list spells it (lower-cased), in order, once.

    Chinese has no spaces, so a name's characters may belong to the words beside it instead
    (东西|安抚 holds 西安): a Chinese name counts only where each edge is a function character
    (的, 在) or a bigram no chunk of the knowledge base holds (``frequency``: how many do).
    """
    found = [*_latin_places(query), *_chinese_places(query, frequency)]
    return list(dict.fromkeys(name.lower() for _, name in sorted(found)))


def _latin_places(query: str) -> list[tuple[int, str]]:
    words = [(m.start(), m.group(0)) for m in _WORD.finditer(query)]
    found = []
    i = 0
    while i < len(words):
        if words[i][1][0].islower():  # every listed name starts with a capital
            i += 1
            continue
        for size in range(min(_LATIN_WORDS, len(words) - i), 0, -1):
            name = " ".join(word for _, word in words[i : i + size])
            if name in _LATIN:
                found.append((words[i][0], name))
                i += size - 1
                break
        i += 1
    return found


def _chinese_places(query: str, frequency: Callable[[str], int]) -> list[tuple[int, str]]:
    found = []
    i = 0
    while i < len(query):
        for name in _BY_FIRST.get(query[i], ()):
            if query.startswith(name, i):
                if _stands_alone(query, i, i + len(name), frequency):
                    found.append((i, name))
                i += len(name) - 1
                break
        i += 1
    return found


def _stands_alone(query: str, start: int, end: int, frequency: Callable[[str], int]) -> bool:
    before = query[start - 1 : start + 1] if start else ""
    after = query[end - 1 : end + 1]
    return not (_joined(before, before[:1], frequency) or _joined(after, after[1:], frequency))


def _joined(edge: str, neighbour: str, frequency: Callable[[str], int]) -> bool:
    """Whether the two characters across a name's edge may be one word: both Chinese, the one
    beside the name no function character, and a bigram the knowledge base holds."""
    return (
        len(edge) == 2
        and all(CJK.fullmatch(c) for c in edge)
        and neighbour not in CJK_FUNCTION_CHARS
        and frequency(edge) > 0
    )


def spellings(place: str) -> list[str]:
    """Every spelling of ``place`` (as ``places_named`` gives it), lower-cased, once each."""
    return list(_SPELLINGS.get(_IDENTITY.get(place, place), {place: None}))


def written_terms(place: str) -> list[list[str]]:
    """The lexical terms of each spelling of ``place``: a knowledge base writes the place where
    it holds every term of one of them."""
    return [terms(name) for name in spellings(place)]
