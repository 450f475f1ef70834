"""The words of raycl's built-in SemEval-2022 Task 2 set (:mod:`raycl.data.semeval_corpus` samples from them).

Data, not code: the multiword expressions with their meanings and their idiomatic and literal uses (``{m}``
marks the MWE, ``{p}`` a person's name), the names and context sentences that fill them, and the STS
generator's slot words. Adding an MWE or a synonym is an edit here alone; the sampling, the splits and the
official CSV layouts stay in :mod:`raycl.data.semeval_corpus`.
"""

from __future__ import annotations

# (MWE, idiomatic meaning, literal meaning, idiomatic uses, literal uses)
EN_MWES = [
    (
        "big fish",
        "powerful person",
        "large fish",
        ["In this small town, {p} is a {m} in local politics.", "The bank hired a {m} from Wall Street."],
        ["{p} caught a {m} in the lake this morning.", "A {m} swam past the divers near the reef."],
    ),
    (
        "night owl",
        "late sleeper",
        "nocturnal bird",
        ["{p} is a real {m} and answers emails at three in the morning.", "As a {m}, she writes after midnight."],
        ["We heard a {m} calling from the old oak tree.", "The {m} hunted mice in the barn all night."],
    ),
    (
        "cold feet",
        "nervous doubts",
        "chilly feet",
        ["{p} got {m} the day before the wedding.", "Investors developed {m} and pulled out of the deal."],
        ["After walking in the snow, {p} had {m} and wet socks.", "Wool socks help if you suffer from {m}."],
    ),
    (
        "in the red",
        "in debt",
        "in the crimson",
        ["After a bad year, the shop is {m} again.", "The airline has been {m} since the pandemic."],
        ["The teacher marked every mistake {m} ink.", "The warning was printed {m} box at the top."],
    ),
    (
        "hot potato",
        "controversial issue",
        "warm potato",
        [
            "Immigration became a political {m} during the campaign.",
            "Nobody wanted to touch the {m} of tax reform.",
        ],
        ["{p} burned two fingers on a {m} from the oven.", "He dropped a {m} into the soup pot."],
    ),
    (
        "black sheep",
        "family outcast",
        "dark-wooled sheep",
        ["{p} was always the {m} of the family.", "The {m} of the band left to play jazz."],
        ["A single {m} grazed among the white ones on the hill.", "The farmer sheared the {m} first this spring."],
    ),
    (
        "green light",
        "official approval",
        "green signal lamp",
        ["The city council gave the {m} to the new stadium.", "{p} finally got the {m} for the research project."],
        ["The driver waited for the {m} at the crossing.", "A {m} flashed on the dashboard."],
    ),
    (
        "low-hanging fruit",
        "easy win",
        "fruit on low branches",
        ["The new manager went after the {m} first.", "Fixing the typos is {m} for the editors."],
        ["The goats ate all the {m} in the orchard.", "{p} picked the {m} because the top was out of reach."],
    ),
    (
        "sitting duck",
        "easy target",
        "resting duck",
        ["Without a firewall, the server is a {m} for hackers.", "Parked in the open, the convoy was a {m}."],
        ["A {m} floated quietly near the reeds.", "{p} photographed a {m} on the riverbank."],
    ),
    (
        "dark horse",
        "surprise contender",
        "black horse",
        ["The young senator is a {m} in the presidential race.", "{p} was the {m} of the chess tournament."],
        ["A {m} galloped across the field.", "The farmer bought a {m} at the market."],
    ),
    (
        "rat race",
        "exhausting routine",
        "race of rats",
        ["{p} quit the {m} and moved to the countryside.", "Commuting every day felt like a {m} to him."],
        ["The students organised a {m} in the biology lab.", "Children cheered at the {m} at the fair."],
    ),
    (
        "white elephant",
        "useless possession",
        "pale elephant",
        ["The new airport turned out to be a {m} that nobody uses.", "The old mansion became a {m} for them."],
        ["Visitors crowded around the rare {m} at the zoo.", "A {m} bathed in the river at dawn."],
    ),
    (
        "red tape",
        "bureaucracy",
        "red adhesive tape",
        ["The project was delayed by months of {m}.", "{p} spent weeks cutting through {m} to get a visa."],
        ["She sealed the parcel with {m}.", "The workers marked the floor with {m}."],
    ),
    (
        "hot air",
        "empty talk",
        "heated air",
        ["The minister's promises were just {m}.", "{p} dismissed the report as {m}."],
        ["The balloon rose as the {m} filled it.", "A fan blew {m} across the drying room."],
    ),
    (
        "silver bullet",
        "magic solution",
        "bullet made of silver",
        ["There is no {m} for climate change.", "Investors hoped the new drug would be a {m}."],
        ["In the film, only a {m} can kill the werewolf.", "The museum displays a {m} from 1750."],
    ),
    (
        "guinea pig",
        "test subject",
        "small rodent pet",
        ["{p} agreed to be a {m} for the new vaccine.", "The pupils were used as {m}s for the new method."],
        ["{p} keeps a {m} in a cage in the bedroom.", "The {m} squeaked when it saw the lettuce."],
    ),
    (
        "snake oil",
        "fake remedy",
        "oil from snakes",
        ["Many experts call the new diet pills {m}.", "{p} refused to buy the {m} sold online."],
        ["Traditional healers extracted {m} for the ceremony.", "The stall sold jars of {m} next to herbs."],
    ),
    (
        "glass ceiling",
        "invisible barrier",
        "ceiling made of glass",
        ["{p} finally broke through the {m} at the bank.", "Many workers still face a {m} at work."],
        ["Sunlight poured through the {m} of the greenhouse.", "The architect designed a {m} for the lobby."],
    ),
    (
        "smoking gun",
        "conclusive evidence",
        "gun that is still smoking",
        ["The leaked email was the {m} investigators needed.", "Prosecutors never found a {m} in the case."],
        ["The detective found the {m} next to the body.", "The hunter lowered his {m} and looked up."],
    ),
    (
        "old flame",
        "former lover",
        "old fire",
        ["At the reunion, {p} met the {m} from high school.", "He still writes letters to his {m} from college."],
        ["The {m} in the fireplace had almost died out.", "Campers warmed their hands over the {m}."],
    ),
    (
        "wild card",
        "unpredictable factor",
        "joker card",
        ["The weather is the {m} in tomorrow's race.", "{p} is the {m} of this election."],
        ["{p} played a {m} and won the game.", "The deck contains one {m} with a clown on it."],
    ),
    (
        "rocket science",
        "something complicated",
        "science of rockets",
        ["Cooking rice is not {m}.", "Filling in the form is hardly {m}, {p} said."],
        ["{p} studied {m} at the space institute.", "Early {m} began with simple fireworks."],
    ),
    (
        "ivory tower",
        "academic isolation",
        "tower made of ivory",
        ["Critics say economists live in their {m}.", "{p} left the {m} to work with real patients."],
        ["The palace had a small {m} filled with jewels.", "The carved {m} on the chessboard was very old."],
    ),
    (
        "bad apple",
        "troublemaker",
        "rotten apple",
        ["One {m} can spoil the whole team.", "The police chief called the officer a {m}."],
        ["{p} threw the {m} into the compost bin.", "There was a {m} at the bottom of the basket."],
    ),
    (
        "shrinking violet",
        "shy person",
        "wilting flower",
        ["{p} is no {m} when it comes to debates.", "In meetings he is a real {m}."],
        ["A {m} drooped in the pot on the windowsill.", "She watered the {m} in the garden."],
    ),
]
PT_MWES = [
    (
        "peixe grande",
        "figurão",
        "peixe enorme",
        ["Na política local, {p} é um {m}.", "A empresa contratou um {m} do mercado financeiro."],
        ["{p} pescou um {m} no rio hoje cedo.", "Um {m} nadava perto do barco."],
    ),
    (
        "pé frio",
        "azarado",
        "pé gelado",
        ["O time sempre perde com {p} no estádio: é um {m}.", "Ninguém quer um {m} na equipe."],
        ["Depois de andar na neve, {p} ficou com o {m}.", "Meias de lã ajudam quem tem o {m} no inverno."],
    ),
    (
        "ovelha negra",
        "rebelde",
        "ovelha preta",
        ["{p} sempre foi a {m} da família.", "A {m} da banda saiu para tocar jazz."],
        ["Uma {m} pastava entre as brancas no morro.", "O pastor tosquiou a {m} primeiro."],
    ),
    (
        "luz verde",
        "autorização",
        "luz de cor verde",
        ["A prefeitura deu {m} para o novo estádio.", "{p} finalmente recebeu {m} para o projeto."],
        ["O motorista esperou a {m} no cruzamento.", "Uma {m} piscou no painel do carro."],
    ),
    (
        "carta branca",
        "liberdade total",
        "carta em branco",
        ["O diretor deu {m} ao treinador.", "{p} recebeu {m} para reorganizar a equipe."],
        ["{p} encontrou uma {m} dentro do envelope.", "Ele guardou uma {m} na gaveta."],
    ),
    (
        "braço direito",
        "principal assistente",
        "braço do lado direito",
        ["{p} é o {m} do presidente.", "Ela se tornou o {m} do diretor."],
        ["{p} quebrou o {m} jogando futebol.", "O médico examinou o {m} do paciente."],
    ),
]
NAMES = {
    "EN": ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro"],
    "PT": ["Ana", "Bruno", "Carla", "Diego", "Elisa", "Fábio"],
}
CONTEXTS = {
    "EN": (
        [
            "It was a quiet week in the town.",
            "The story first appeared in a local newspaper.",
            "Several people were asked about it later.",
            "This happened at the end of last year.",
            "Few details were known at first.",
            "Everyone had an opinion about it.",
        ],
        [
            "Nobody was surprised by what happened next.",
            "More details are expected next week.",
            "The rest of the day passed without news.",
            "Friends later talked about it for hours.",
            "It was not the first time.",
            "The reporter promised to follow the story.",
        ],
    ),
    "PT": (
        [
            "Foi uma semana tranquila na cidade.",
            "A história saiu primeiro num jornal local.",
            "Várias pessoas comentaram o caso depois.",
            "Isso aconteceu no fim do ano passado.",
        ],
        [
            "Ninguém se surpreendeu com o que veio depois.",
            "Mais detalhes devem sair na próxima semana.",
            "O resto do dia passou sem novidades.",
            "Não foi a primeira vez.",
        ],
    ),
}
# STS generator slots: (form, synonym form)
STS_SLOTS = {
    "EN": (
        "A {s} is {a} {t}.",
        [("man", "guy"), ("woman", "lady"), ("child", "kid"), ("student", "pupil"), ("chef", "cook")],
        [
            ("playing the guitar", "strumming a guitar"),
            ("reading a book", "looking through a book"),
            ("riding a bicycle", "cycling"),
            ("cooking dinner", "preparing dinner"),
            ("eating an apple", "biting into an apple"),
            ("walking in the park", "strolling through the park"),
            ("washing the dishes", "cleaning the plates"),
            ("talking on the phone", "speaking on the telephone"),
        ],
        [
            ("in the morning", "early in the day"),
            ("at night", "late in the evening"),
            ("after lunch", "in the early afternoon"),
            ("on Sunday", "at the weekend"),
        ],
    ),
    "PT": (
        "{s} está {a} {t}.",
        [
            ("um homem", "um rapaz"),
            ("uma mulher", "uma senhora"),
            ("uma criança", "um menino"),
            ("um aluno", "um estudante"),
            ("um cozinheiro", "um chef"),
        ],
        [
            ("tocando violão", "dedilhando um violão"),
            ("lendo um livro", "folheando um livro"),
            ("andando de bicicleta", "pedalando"),
            ("preparando o jantar", "fazendo o jantar"),
            ("comendo uma maçã", "mordendo uma maçã"),
            ("caminhando no parque", "passeando pelo parque"),
            ("lavando a louça", "limpando os pratos"),
            ("falando ao telefone", "conversando ao telefone"),
        ],
        [
            ("de manhã", "pela manhã"),
            ("à noite", "de noite"),
            ("depois do almoço", "após o almoço"),
            ("no domingo", "no fim de semana"),
        ],
    ),
}
